#!/usr/bin/env bash
# Builds the AACO agent image, localhost/aaco:latest and localhost/aaco:<version> (the version of
# pyproject.toml, which `aaco --version` prints), with Debian's podman on a machine that reaches no
# container registry (docs/deploy.md, "The image"). From anywhere in the repository:
#
#   bash deploy/image/build.sh                  build; idempotent (reuses the base image and podman's layer cache)
#   bash deploy/image/build.sh --refresh-base   make the Debian base again (newer packages), then build
#   bash deploy/image/build.sh --check-podman   only make sure podman works here (as root: install it); exit 1 if not
#
# Steps:
#   1. tools: podman, runc, mmdebstrap and the CNI plugins, installed with apt-get when missing (as
#             root on Debian). Not needed: buildah (podman build has it built in), uidmap and
#             fuse-overlayfs (rootless podman, which this script does not use);
#   2. base:  localhost/aaco-base:bookworm, a minbase root filesystem of Debian bookworm made by
#             mmdebstrap from Debian's mirror and imported into podman (made once; --refresh-base);
#   3. build: deploy/image/Containerfile FROM that base: Debian's python3 and python3-bpfcc, the
#             project and its wheels from PyPI in a virtualenv in /opt/aaco;
#   4. check: `aaco --version` and `aaco run -n 1` inside it, as uid 10001, read-only root, no network;
#   5. size:  the image's size.
#
# Podman on this kind of machine (root, no systemd session, cgroup v1, a host nofile hard limit far
# below podman's default of 1048576): every podman command runs with
#   podman --runtime runc --cgroup-manager cgroupfs ...
# and every container (the build's RUN steps too) with ulimits at or below the host's:
#   --ulimit nofile=1024:4096 --ulimit nproc=1024:4096
# (without them runc fails: "error setting rlimits ... operation not permitted"). Storage: podman's
# default overlay driver (native overlay on ext4 as root); where overlay does not work set
# AACO_PODMAN_STORAGE_DRIVER=vfs (slower, larger). Network: the build's default network (CNI
# bridge) reaches Debian's mirror and PyPI; where it does not, AACO_BUILD_NETWORK=host.
#
# Environment (all optional):
#   AACO_PODMAN_STORAGE_DRIVER  podman --storage-driver (default: podman's own, overlay)
#   AACO_BUILD_NETWORK          podman build --network (default: podman's own; host where the bridge fails)
#   AACO_BUILD_CA               CA bundle pip trusts in the build (default /etc/ssl/certs/ca-certificates.crt,
#                               which holds the CA of a TLS-intercepting proxy when the host trusts one)
#   AACO_DEBIAN_MIRROR          Debian mirror for the base (default http://deb.debian.org/debian;
#                               a snapshot.debian.org URL works: Check-Valid-Until is off)
#   AACO_DEBIAN_SECURITY_MIRROR (default http://deb.debian.org/debian-security)
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE=localhost/aaco
BASE=localhost/aaco-base:bookworm
SUITE=bookworm
CONTAINERFILE=deploy/image/Containerfile
IGNOREFILE=deploy/image/Containerfile.dockerignore
UID_GID=10001:10001
ULIMITS=(--ulimit nofile=1024:4096 --ulimit nproc=1024:4096)
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
if [ -n "${AACO_PODMAN_STORAGE_DRIVER:-}" ]; then
  PODMAN+=(--storage-driver "$AACO_PODMAN_STORAGE_DRIVER")
fi
APT_PACKAGES=(podman runc mmdebstrap containernetworking-plugins iptables ca-certificates)
MIRROR=${AACO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${AACO_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
CA=${AACO_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}

say() { echo "build.sh: $*" >&2; }
die() {
  echo "build.sh: error: $1" >&2
  shift
  for fix in "$@"; do echo "  fix: $fix" >&2; done
  exit 1
}

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }

refresh_base=0
check_only=0
for arg in "$@"; do
  case "$arg" in
    --refresh-base) refresh_base=1 ;;
    --check-podman) check_only=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $arg" "run: bash deploy/image/build.sh [--refresh-base | --check-podman]" ;;
  esac
done

# --- 1. tools -------------------------------------------------------------------------------------
ensure_tools() {
  local missing=() cmd
  for cmd in podman runc mmdebstrap; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      say "[1/5] installing ${APT_PACKAGES[*]} with apt-get (missing: ${missing[*]})"
      export DEBIAN_FRONTEND=noninteractive
      local aptlog
      aptlog=$(mktemp "${TMPDIR:-/var/tmp}/aaco-apt.XXXXXX")
      if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}"; } >"$aptlog" 2>&1; then
        tail -n 20 "$aptlog" >&2
        die "apt-get could not install ${APT_PACKAGES[*]} (the end of its output above, all of it in $aptlog)" \
          "check that this machine reaches Debian's mirror (apt-get update), then run this script again"
      fi
      rm -f "$aptlog"
    else
      die "missing ${missing[*]}" \
        "as root on Debian: apt-get install --no-install-recommends ${APT_PACKAGES[*]}" \
        "or run this script as root, which installs them"
    fi
  fi
  if [ "$(id -u)" != 0 ]; then
    die "not root: this script runs rootful podman and mmdebstrap's root mode" "run it as root (sudo bash deploy/image/build.sh)"
  fi
  local out
  if ! out=$("${PODMAN[@]}" info --format '{{.Store.GraphDriverName}} {{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}' 2>&1); then
    die "podman does not work here: $out" \
      "overlay storage unsupported on this filesystem: AACO_PODMAN_STORAGE_DRIVER=vfs bash deploy/image/build.sh" \
      "storage left by another driver: podman system reset (removes every image and container)"
  fi
  say "[1/5] podman $(podman --version | awk '{print $3}'): storage driver, runtime, cgroup manager: $out"
}

ensure_tools
if [ "$check_only" = 1 ]; then
  exit 0
fi

start=$SECONDS
version=$(sed -n 's/^version = "\([^"]*\)".*/\1/p' pyproject.toml | head -n 1)
[ -n "$version" ] || die "no version in pyproject.toml" "pyproject.toml's [project] needs version = \"X.Y.Z\""
say "building $IMAGE:$version and $IMAGE:latest"

# --- 2. base --------------------------------------------------------------------------------------
if [ "$refresh_base" = 0 ] && "${PODMAN[@]}" image exists "$BASE"; then
  say "[2/5] base $BASE exists (made $("${PODMAN[@]}" image inspect --format '{{.Created}}' "$BASE" | cut -c1-19)); --refresh-base makes it again"
else
  say "[2/5] making the base $BASE with mmdebstrap ($SUITE, minbase, from $MIRROR)"
  workdir=$(mktemp -d "${TMPDIR:-/var/tmp}/aaco-base.XXXXXX")
  trap 'rm -rf "$workdir"' EXIT
  # minbase: Essential packages and apt. merged-usr: /bin -> usr/bin as every bookworm system
  # (without the hook apt would pull usrmerge and Perl). Apt and dpkg settings stay in the base
  # (/etc/apt/apt.conf.d/99mmdebstrap, /etc/dpkg/dpkg.cfg.d/99mmdebstrap): no recommends, no
  # documentation or man pages, release files accepted after their Valid-Until (snapshot mirrors).
  if ! mmdebstrap --variant=minbase \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --skip=output/dev \
    "$SUITE" "$workdir/base.tar" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main" \
    </dev/null >"$workdir/mmdebstrap.log" 2>&1; then
    tail -n 20 "$workdir/mmdebstrap.log" >&2
    die "mmdebstrap could not make the $SUITE root filesystem (its log above)" \
      "check that this machine reaches $MIRROR (or set AACO_DEBIAN_MIRROR to a mirror it reaches)"
  fi
  "${PODMAN[@]}" import --quiet \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase from mmdebstrap, the AACO image's base\"" \
    "$workdir/base.tar" "$BASE" >/dev/null \
    || die "podman import of the base failed" "see podman's message above"
  rm -rf "$workdir"
  trap - EXIT
  say "[2/5] base $BASE: $("${PODMAN[@]}" image inspect --format '{{.Size}}' "$BASE" | numfmt --to=si)B"
fi

# --- 3. build -------------------------------------------------------------------------------------
build_args=(
  --file "$CONTAINERFILE"
  --ignorefile "$IGNOREFILE"
  --build-arg "BASE_IMAGE=$BASE"
  --label "org.opencontainers.image.title=aaco"
  --label "org.opencontainers.image.description=AACO, the GPU observability node agent"
  --label "org.opencontainers.image.version=$version"
  --label "org.opencontainers.image.licenses=Apache-2.0"
  --tag "$IMAGE:$version"
  --tag "$IMAGE:latest"
  "${ULIMITS[@]}"
)
if revision=$(git rev-parse HEAD 2>/dev/null); then
  build_args+=(--label "org.opencontainers.image.revision=$revision")
fi
if [ -s "$CA" ]; then
  build_args+=(--secret "id=pip-ca,src=$CA")
fi
if [ -n "${AACO_BUILD_NETWORK:-}" ]; then
  build_args+=(--network "$AACO_BUILD_NETWORK")
fi
log=$(mktemp "${TMPDIR:-/var/tmp}/aaco-image-build.XXXXXX")
say "[3/5] podman build -f $CONTAINERFILE . (the whole output: $log)"
set +e
"${PODMAN[@]}" build "${build_args[@]}" . >"$log" 2>&1 &
build_pid=$!
# Progress: the Containerfile's steps as podman starts them.
tail --pid="$build_pid" -n +1 -f "$log" | grep --line-buffered -E 'STEP [0-9]+/[0-9]+' | cut -c1-140 | sed -u 's/^/  /' >&2
wait "$build_pid"
rc=$?
set -e
if [ "$rc" != 0 ]; then
  tail -n 30 "$log" >&2
  fixes=()
  if grep -q -E 'CERTIFICATE_VERIFY_FAILED|SSLError|certificate verify failed' "$log"; then
    fixes+=("pip did not trust PyPI's certificate (a TLS-intercepting proxy?): AACO_BUILD_CA=/path/to/its-ca-bundle.pem bash deploy/image/build.sh")
  fi
  if grep -q -E 'Temporary failure (in name )?resolv|Could not resolve|Failed to fetch|Network is unreachable|Failed to establish a new connection' "$log"; then
    fixes+=("the build's containers could not reach Debian's mirror or PyPI: AACO_BUILD_NETWORK=host bash deploy/image/build.sh")
  fi
  if grep -q -E 'rlimit' "$log"; then
    fixes+=("ulimits above the host's: lower them in this script's ULIMITS (ulimit -Hn, ulimit -Hu show the host's)")
  fi
  if grep -q -E 'No space left on device' "$log"; then
    fixes+=("free disk space under /var/lib/containers (podman image prune)")
  fi
  fixes+=("the whole build output is in $log")
  die "podman build failed (exit $rc)" "${fixes[@]}"
fi
rm -f "$log"

# --- 4. check -------------------------------------------------------------------------------------
# As the image runs in the chart and in the image test: its uid, read-only root, no network (the
# default model is inside the image, from the onnx wheel).
run=("${PODMAN[@]}" run --rm "${ULIMITS[@]}" --network none --read-only --user "$UID_GID" "$IMAGE:$version")
said=$("${run[@]}" --version 2>&1) || die "aaco --version failed in the image: $said" "see the message; the build log is gone, rerun the build"
[ "$said" = "aaco $version" ] || die "the image's aaco --version says '$said', not 'aaco $version'" "rebuild: bash deploy/image/build.sh"
say "[4/5] $said; aaco run -n 1 inside (uid ${UID_GID%%:*}, read-only root, no network)"
if ! out=$("${run[@]}" run -n 1 --warmup 0 --no-progress --out /tmp/smoke 2>&1); then
  echo "$out" | tail -n 20 >&2
  die "aaco run -n 1 failed inside the image" "see its output above"
fi

# --- 5. size --------------------------------------------------------------------------------------
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE:$version")
say "[5/5] built $IMAGE:$version and $IMAGE:latest in $((SECONDS - start)) s: $(numfmt --to=si "$size")B ($size bytes)"
say "run it: podman --runtime runc --cgroup-manager cgroupfs run --rm ${ULIMITS[*]} --user $UID_GID --read-only -p 9464:9464 $IMAGE:latest agent"
