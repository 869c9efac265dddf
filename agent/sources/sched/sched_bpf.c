// AACO sched source: the eBPF program (bcc), loaded by aaco.agent.sources.sched.ebpf.
//
// Tracepoints only (kprobes may be unavailable): sched:sched_switch, sched:sched_process_exit,
// exceptions:page_fault_user, task:task_newtask (its clone_flags tell a new thread from a new
// process, so threads a target creates are tracked from birth), sched:sched_process_exec (a new
// name), and, only where the kernel's run-queue accounting cannot be read (below),
// sched:sched_wakeup and sched:sched_wakeup_new.
//
// Two ways to attach, one set of handlers. With AACO_RAW the tracepoints are attached raw
// (BPF_RAW_TRACEPOINT_OPEN: no perf record is built per event, which on a context-switch storm
// is most of the cost); their arguments are task pointers, read at the offsets of the running
// kernel's struct task_struct that the agent takes from its BTF (AACO_PID_OFF, AACO_TGID_OFF,
// AACO_STATE_OFF) — never from the installed headers, which may be of another kernel. Without
// AACO_RAW they are classic tracepoints and everything comes from their formatted arguments.
//
// Filtering happens here: a task is traced when its tgid is in `targets` (the agent maintains it)
// or, compiled with AACO_ALL_TASKS, always. Aggregation happens here too: per thread on-CPU and
// off-CPU ns, runqueue wait, voluntary and involuntary switches, page faults, and a log2 histogram
// of its runqueue waits (the agent sums them per process). The agent drains the cumulative map
// every interval; nothing goes to user space per switch, except, when AACO_OFFCPU_MIN_NS > 0,
// off-CPU intervals at least that long through a bounded ring buffer (losses are counted).
//
// Cost (see docs/sched.md): every figure is taken on the *switching-out* side, where the thread
// is `current`, so a switch does one lookup in the thread map and never touches the incoming
// thread. A per-CPU slot holds the time of the CPU's last switch, which is when the outgoing
// thread came in: its slice is now minus that, and the gap before the slice (its previous switch-
// out to that time) is its off-CPU interval. With AACO_SCHED_INFO_OFF (the offset of
// task_struct.sched_info, from BTF), runqueue waits are the kernel's own: sched_info.pcount and
// .run_delay (one 16-byte read) against their values at the thread's previous switch-out, so no
// wakeup program runs at all. Without it, sched_wakeup marks when a thread became runnable and the
// switch-out takes the wait from there to the slice's start. Raw attachments key threads by their
// task_struct pointer; the tid and tgid of a thread are those of `current` when its entry is made.
// A new task's entry is reset at task_newtask, so a recycled task_struct never inherits another
// thread's counters.
//
// Bounds: every map has a fixed size; the per-thread map is an LRU hash, so thousands of
// short-lived tasks never grow it. An exiting thread's entry is flagged: its final switch (its
// prev_state is X or Z) credits its last slice, and the agent reads it one last time and deletes it.
//
// Settings (cflags): AACO_MAX_TARGETS, AACO_MAX_THREADS, AACO_OFFCPU_MIN_NS, AACO_RINGBUF_PAGES,
// AACO_ALL_TASKS (defined or not), AACO_HAVE_GROUP_DEAD (the running kernel's sched_process_exit
// has the group_dead argument), AACO_SCHED_INFO_OFF (optional); raw: AACO_RAW, AACO_PID_OFF,
// AACO_TGID_OFF, AACO_SWITCH_HAS_STATE (sched_switch passes prev_state) or AACO_STATE_OFF.

// Constants, struct aaco_thread_t, the targets, counters and off-CPU ring buffer maps and the
// shared accounting (aaco_wanted, aaco_wait, aaco_sched_info, aaco_gap, aaco_switched_out) are in
// sched_common.h, which the agent prepends to this file.

BPF_TABLE("lru_hash", u64, struct aaco_thread_t, threads, AACO_MAX_THREADS);
BPF_PERCPU_ARRAY(last_switch, u64, 1);  // per CPU: when it last switched (boot ns), i.e. when `current` came in

// The entry under `key`, created when missing; `tgid` (0: unknown) is recorded when known.
static __always_inline struct aaco_thread_t *aaco_thread(u64 key, u32 tid, u32 tgid) {
    struct aaco_thread_t *t = threads.lookup(&key);
    if (!t) {
        struct aaco_thread_t zero = {};
        zero.tid = tid;
        zero.tgid = tgid;
        t = threads.lookup_or_try_init(&key, &zero);
        if (!t) {
            aaco_count(CNT_THREADS_FULL);
            return NULL;
        }
    }
    if (tgid && t->tgid != tgid)
        t->tgid = tgid;
    return t;
}

static __always_inline u32 aaco_read_u32(void *task, u32 offset) {
    u32 v = 0;
#ifdef AACO_RAW
    if (task)
        bpf_probe_read_kernel(&v, sizeof(v), (char *)task + offset);
#endif
    return v;
}

#ifdef AACO_RAW
#define AACO_TID_OF(task, tid) aaco_read_u32(task, AACO_PID_OFF)
#define AACO_TGID_OF(task) aaco_read_u32(task, AACO_TGID_OFF)
#define AACO_CURRENT_KEY() ((u64)bpf_get_current_task())
#else
#define AACO_TID_OF(task, tid) (tid)
#define AACO_TGID_OF(task) 0  // classic: learnt when the thread is next `current`
#define AACO_CURRENT_KEY() ((u64)(u32)bpf_get_current_pid_tgid())
#endif

// -- handlers -----------------------------------------------------------------------------------

// A switch away from `current` (tid `prev`, key `prev_key`, task_struct `prev_task`).
static __always_inline int aaco_switch(u64 prev_key, u32 prev, void *prev_task, int involuntary,
                                       int uninterruptible, int dead) {
    u64 now = bpf_ktime_get_boot_ns();
    u32 zero_idx = 0;
    u64 *last = last_switch.lookup(&zero_idx);
    if (!last)
        return 0;
    u64 in_ts = *last;  // when `current` came in (0: before this program was attached)
    *last = now;
    if (prev == 0)
        return 0;  // the idle task

    struct aaco_thread_t *t;
    if (dead) {
        t = threads.lookup(&prev_key);  // credited only when already traced
    } else {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (!aaco_wanted(tgid))
            return 0;
        t = aaco_thread(prev_key, prev, tgid);
    }
    if (!t)
        return 0;

    if (in_ts && now > in_ts) {
        t->oncpu_ns += now - in_ts;
        aaco_gap(t, in_ts, 0);
    }

#ifdef AACO_SCHED_INFO_OFF
    u64 info[2] = {};  // struct sched_info { unsigned long pcount; unsigned long long run_delay; ... }
    bpf_probe_read_kernel(info, sizeof(info), (char *)prev_task + AACO_SCHED_INFO_OFF);
    aaco_sched_info(t, info[0], info[1]);
#else
    // Runnable since a wakeup or a preemption before this slice began: that wait ended at `in_ts`.
    if (t->ready_ts && in_ts >= t->ready_ts)
        aaco_wait(t, in_ts - t->ready_ts, 1);
    t->ready_ts = (involuntary && !dead) ? now : 0;
#endif

    if (dead) {
        t->flags |= ST_EXITED;
#ifdef AACO_RAW
        // Its task_struct is about to be freed and recycled: keep the final counters under its tid
        // (never a kernel address) until the agent has read them.
        u64 tid_key = prev;
        threads.update(&tid_key, t);
        threads.delete(&prev_key);
#endif
        return 0;
    }
    aaco_switched_out(t, involuntary, uninterruptible, now);
    if (t->comm[0] == 0)
        bpf_get_current_comm(&t->comm, sizeof(t->comm));
    return 0;
}

#ifndef AACO_SCHED_INFO_OFF
static __always_inline int aaco_wakeup(u64 key, u32 tid, void *task) {
    struct aaco_thread_t *t = threads.lookup(&key);
#ifdef AACO_ALL_TASKS
    if (!t) {
        u32 id = AACO_TID_OF(task, tid);
        if (id == 0)
            return 0;
        t = aaco_thread(key, id, AACO_TGID_OF(task));
    }
#endif
    // A wakeup of a thread already waiting does not start a new wait; one that lands while the
    // thread is still on its CPU is later than the slice's start, and the switch-out ignores it.
    if (t && t->ready_ts == 0)
        t->ready_ts = bpf_ktime_get_boot_ns();
    return 0;
}
#endif

static __always_inline int aaco_newtask(u64 key, u32 child, u64 clone_flags) {
    // `current` is the parent; a thread joins its tgid, a new process is its own tgid.
    u32 tgid = (clone_flags & AACO_CLONE_THREAD) ? (u32)(bpf_get_current_pid_tgid() >> 32) : child;
    if (!aaco_wanted(tgid)) {
        threads.delete(&key);  // a recycled key must not carry another thread's counters
        return 0;
    }
    struct aaco_thread_t zero = {};
    zero.tid = child;
    zero.tgid = tgid;
#ifdef AACO_SCHED_INFO_OFF
    zero.flags = ST_INFO_SEEN;  // a new task's sched_info starts at zero
#endif
    threads.update(&key, &zero);
    return 0;
}

static __always_inline int aaco_exec(void) {
    u64 key = AACO_CURRENT_KEY();
    struct aaco_thread_t *t = threads.lookup(&key);
    if (t)
        bpf_get_current_comm(&t->comm, sizeof(t->comm));
    return 0;
}

static __always_inline int aaco_exit(int group_dead) {
    u64 id = bpf_get_current_pid_tgid();
    u64 key = AACO_CURRENT_KEY();
    struct aaco_thread_t *t = threads.lookup(&key);
    if (t)
        t->flags |= ST_EXITED;
#ifndef AACO_ALL_TASKS
    if (group_dead) {
        u32 tgid = id >> 32;
        targets.delete(&tgid);
    }
#endif
    return 0;
}

static __always_inline int aaco_fault(void) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!aaco_wanted(tgid))
        return 0;
    struct aaco_thread_t *t = aaco_thread(AACO_CURRENT_KEY(), (u32)id, tgid);
    if (t) {
        t->faults++;
        t->fault_ts = bpf_ktime_get_boot_ns();
    }
    return 0;
}

// -- attachments ----------------------------------------------------------------------------------

#ifdef AACO_RAW

RAW_TRACEPOINT_PROBE(sched_switch) {
    // (bool preempt, struct task_struct *prev, struct task_struct *next[, unsigned int prev_state])
    u64 preempt = ctx->args[0];
#ifdef AACO_SWITCH_HAS_STATE
    u64 state = ctx->args[3];
#else
    u64 state = aaco_read_u32((void *)ctx->args[1], AACO_STATE_OFF);
#endif
    u32 prev = (u32)bpf_get_current_pid_tgid();
    // As the kernel counts them: a switch is voluntary when not preempted and the task was not runnable.
    int involuntary = preempt || state == 0;
    return aaco_switch(ctx->args[1], prev, (void *)ctx->args[1], involuntary,
                       !involuntary && (state & AACO_UNINTERRUPTIBLE), (state & AACO_TASK_DEAD) != 0);
}

#ifndef AACO_SCHED_INFO_OFF
RAW_TRACEPOINT_PROBE(sched_wakeup) {
    return aaco_wakeup(ctx->args[0], 0, (void *)ctx->args[0]);
}

RAW_TRACEPOINT_PROBE(sched_wakeup_new) {
    return aaco_wakeup(ctx->args[0], 0, (void *)ctx->args[0]);
}
#endif

RAW_TRACEPOINT_PROBE(task_newtask) {
    return aaco_newtask(ctx->args[0], aaco_read_u32((void *)ctx->args[0], AACO_PID_OFF), ctx->args[1]);
}

RAW_TRACEPOINT_PROBE(sched_process_exec) {
    return aaco_exec();
}

RAW_TRACEPOINT_PROBE(sched_process_exit) {
#ifdef AACO_HAVE_GROUP_DEAD
    return aaco_exit(ctx->args[1] != 0);
#else
    return aaco_exit(0);
#endif
}

RAW_TRACEPOINT_PROBE(page_fault_user) {
    return aaco_fault();
}

#else  // classic tracepoints

TRACEPOINT_PROBE(sched, sched_switch) {
    long state = args->prev_state;
    u32 prev = args->prev_pid;
    return aaco_switch(prev, prev, (void *)bpf_get_current_task(), (state & AACO_STATE_MASK) == 0,
                       (state & AACO_UNINTERRUPTIBLE) != 0, (state & AACO_DEAD_MASK) != 0);
}

#ifndef AACO_SCHED_INFO_OFF
TRACEPOINT_PROBE(sched, sched_wakeup) {
    u32 tid = args->pid;
    return aaco_wakeup(tid, tid, NULL);
}

TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    u32 tid = args->pid;
    return aaco_wakeup(tid, tid, NULL);
}
#endif

TRACEPOINT_PROBE(task, task_newtask) {
    u32 tid = args->pid;
    return aaco_newtask(tid, tid, args->clone_flags);
}

TRACEPOINT_PROBE(sched, sched_process_exec) {
    return aaco_exec();
}

TRACEPOINT_PROBE(sched, sched_process_exit) {
#ifdef AACO_HAVE_GROUP_DEAD
    return aaco_exit(args->group_dead);
#else
    return aaco_exit(0);
#endif
}

TRACEPOINT_PROBE(exceptions, page_fault_user) {
    return aaco_fault();
}

#endif
