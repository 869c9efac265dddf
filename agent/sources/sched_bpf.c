// AACO sched source: the eBPF program (bcc), loaded by aaco.agent.sources.sched_ebpf.
//
// Tracepoints only (kprobes may be unavailable): sched:sched_switch, sched:sched_wakeup,
// sched:sched_wakeup_new, sched:sched_process_exit, exceptions:page_fault_user, and
// task:task_newtask (its clone_flags tell a new thread from a new process, so threads a target
// creates are tracked from their first wakeup). No kernel structure is read: everything comes
// from the tracepoints' own arguments and from helpers, so the program does not depend on the
// layout of the kernel headers it is compiled against.
//
// Filtering happens here: a task is traced when its tgid is in `targets` (the agent maintains it)
// or, compiled with AACO_ALL_TASKS, always. Aggregation happens here too: per tid on-CPU and
// off-CPU ns, runqueue wait, voluntary and involuntary switches, page faults; a log2 histogram of
// runqueue latency (wakeup or preemption to switch-in) per tgid. The agent drains the cumulative
// maps every interval; nothing goes to user space per switch, except, when AACO_OFFCPU_MIN_NS > 0,
// off-CPU intervals at least that long through a bounded ring buffer (losses are counted).
//
// Bounds: every map has a fixed size; the per-thread maps are LRU hashes, so thousands of
// short-lived tasks never grow them. An exiting task's transient state is deleted at its final
// switch (its prev_state is X or Z) and its counters are flagged so the agent reads them one last
// time and deletes them.
//
// Settings (cflags): AACO_MAX_TARGETS, AACO_MAX_THREADS, AACO_MAX_HIST, AACO_OFFCPU_MIN_NS,
// AACO_RINGBUF_PAGES, AACO_ALL_TASKS (defined or not), AACO_HAVE_GROUP_DEAD (the running kernel's
// sched_process_exit has the group_dead argument).

#define AACO_STATE_MASK 0xff        // prev_state bits of a sleeping task; 0: still runnable (preempted or yielded)
#define AACO_UNINTERRUPTIBLE 0x2    // TASK_UNINTERRUPTIBLE as the tracepoint reports it ("D")
#define AACO_DEAD_MASK 0x30          // EXIT_DEAD ("X") | EXIT_ZOMBIE ("Z"): the task's final switch
#define AACO_CLONE_THREAD 0x10000ULL

#define ST_FAULT_BLOCK 1  // the last switch-out was an uninterruptible sleep after a page fault in the same slice
#define ST_EXITED 2       // sched_process_exit seen (on the counters: read them once more, then delete)

#define CNT_RINGBUF_LOST 0
#define CNT_STATE_FULL 1
#define CNT_STATS_FULL 2

struct aaco_state_t {
    u64 in_ts;     // switched in at (0: not on CPU, or not seen yet)
    u64 out_ts;    // switched out at (0: on CPU, or not seen yet)
    u64 ready_ts;  // runnable since (wakeup or preemption; 0: not waiting)
    u64 fault_ts;  // last user page fault in the current slice (0: none)
    u32 tgid;      // 0 until known
    u32 flags;
};

struct aaco_stats_t {
    u64 oncpu_ns;
    u64 offcpu_ns;
    u64 rq_wait_ns;
    u64 fault_offcpu_ns;
    u64 voluntary;
    u64 involuntary;
    u64 faults;
    u64 rq_count;
    u32 tgid;
    u32 flags;
    char comm[16];
};

struct aaco_hist_key_t {
    u32 tgid;
    u32 slot;  // floor(log2(latency ns))
};

struct aaco_offcpu_event_t {
    u64 start_ns;
    u64 end_ns;
    u32 tgid;
    u32 tid;
    u32 flags;
    u32 pad;
    char comm[16];
};

BPF_HASH(targets, u32, u8, AACO_MAX_TARGETS);
BPF_TABLE("lru_hash", u32, struct aaco_state_t, state, AACO_MAX_THREADS);
BPF_TABLE("lru_hash", u32, struct aaco_stats_t, stats, AACO_MAX_THREADS);
BPF_TABLE("lru_hash", struct aaco_hist_key_t, u64, hist, AACO_MAX_HIST);
BPF_PERCPU_ARRAY(counters, u64, 4);
#if AACO_OFFCPU_MIN_NS > 0
BPF_RINGBUF_OUTPUT(offcpu_events, AACO_RINGBUF_PAGES);
#endif

static __always_inline int aaco_wanted(u32 tgid) {
    if (tgid == 0)
        return 0;
#ifdef AACO_ALL_TASKS
    return 1;
#else
    return targets.lookup(&tgid) != NULL;
#endif
}

static __always_inline void aaco_count(u32 idx) {
    u64 *c = counters.lookup(&idx);
    if (c)
        (*c)++;
}

static __always_inline struct aaco_state_t *aaco_state(u32 tid, u32 tgid) {
    struct aaco_state_t zero = {};
    zero.tgid = tgid;
    struct aaco_state_t *st = state.lookup_or_try_init(&tid, &zero);
    if (!st) {
        aaco_count(CNT_STATE_FULL);
        return NULL;
    }
    if (tgid)
        st->tgid = tgid;
    return st;
}

static __always_inline struct aaco_stats_t *aaco_stats(u32 tid, u32 tgid) {
    struct aaco_stats_t zero = {};
    zero.tgid = tgid;
    struct aaco_stats_t *s = stats.lookup_or_try_init(&tid, &zero);
    if (!s) {
        aaco_count(CNT_STATS_FULL);
        return NULL;
    }
    if (tgid)
        s->tgid = tgid;
    return s;
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_boot_ns();
    u32 prev = args->prev_pid;
    u32 next = args->next_pid;
    long prev_state = args->prev_state;

    if (prev != 0 && (prev_state & AACO_DEAD_MASK)) {
        // The final switch of an exiting task: credit its last slice, forget its state.
        struct aaco_state_t *st = state.lookup(&prev);
        if (st) {
            struct aaco_stats_t *s = stats.lookup(&prev);
            if (s && st->in_ts && now > st->in_ts)
                s->oncpu_ns += now - st->in_ts;
            state.delete(&prev);
        }
    } else if (prev != 0) {
        // The switching-out task is still `current`: its tgid comes from the helper.
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (aaco_wanted(tgid)) {
            struct aaco_state_t *st = aaco_state(prev, tgid);
            struct aaco_stats_t *s = aaco_stats(prev, tgid);
            if (st && s) {
                if (st->in_ts && now > st->in_ts)
                    s->oncpu_ns += now - st->in_ts;
                if ((prev_state & AACO_STATE_MASK) == 0) {
                    // Preempted (or yielded): still runnable, so it waits on the runqueue from now.
                    s->involuntary++;
                    st->ready_ts = now;
                    st->flags &= ~ST_FAULT_BLOCK;
                } else {
                    s->voluntary++;
                    st->ready_ts = 0;
                    if ((prev_state & AACO_UNINTERRUPTIBLE) && st->fault_ts)
                        st->flags |= ST_FAULT_BLOCK;
                    else
                        st->flags &= ~ST_FAULT_BLOCK;
                }
                st->fault_ts = 0;
                st->in_ts = 0;
                st->out_ts = now;
                bpf_get_current_comm(&s->comm, sizeof(s->comm));
            }
        }
    }

    if (next != 0) {
        struct aaco_state_t *st = state.lookup(&next);
#ifdef AACO_ALL_TASKS
        if (!st)
            st = aaco_state(next, 0);  // tgid learnt when it is next `current`
#endif
        if (st) {
            u32 tgid = st->tgid;
#ifndef AACO_ALL_TASKS
            if (tgid == 0 || !aaco_wanted(tgid)) {
                state.delete(&next);  // its process is no longer a target
                return 0;
            }
#endif
            if (st->out_ts || st->ready_ts) {
                struct aaco_stats_t *s = aaco_stats(next, tgid);
                if (s) {
                    if (st->out_ts && now > st->out_ts) {
                        u64 off = now - st->out_ts;
                        s->offcpu_ns += off;
                        if (st->flags & ST_FAULT_BLOCK)
                            s->fault_offcpu_ns += off;
#if AACO_OFFCPU_MIN_NS > 0
                        if (off >= AACO_OFFCPU_MIN_NS) {
                            struct aaco_offcpu_event_t *e = offcpu_events.ringbuf_reserve(sizeof(*e));
                            if (e) {
                                e->start_ns = st->out_ts;
                                e->end_ns = now;
                                e->tgid = tgid;
                                e->tid = next;
                                e->flags = st->flags;
                                e->pad = 0;
                                bpf_probe_read_kernel(&e->comm, sizeof(e->comm), args->next_comm);
                                offcpu_events.ringbuf_submit(e, 0);
                            } else {
                                aaco_count(CNT_RINGBUF_LOST);
                            }
                        }
#endif
                    }
                    if (st->ready_ts && now > st->ready_ts) {
                        u64 lat = now - st->ready_ts;
                        s->rq_wait_ns += lat;
                        s->rq_count++;
                        if (tgid) {
                            struct aaco_hist_key_t key = {};
                            key.tgid = tgid;
                            key.slot = bpf_log2l(lat);
                            u64 zero = 0;
                            u64 *slot = hist.lookup_or_try_init(&key, &zero);
                            if (slot)
                                __sync_fetch_and_add(slot, 1);
                        }
                    }
                }
            }
            st->out_ts = 0;
            st->ready_ts = 0;
            st->in_ts = now;
            st->flags &= ~ST_FAULT_BLOCK;
        }
    }
    return 0;
}

static __always_inline int aaco_on_wakeup(u32 tid) {
    struct aaco_state_t *st = state.lookup(&tid);
#ifdef AACO_ALL_TASKS
    if (!st)
        st = aaco_state(tid, 0);
#endif
    // A wakeup of a task that is on a CPU, or already waiting, does not start a new wait.
    if (st && st->in_ts == 0 && st->ready_ts == 0)
        st->ready_ts = bpf_ktime_get_boot_ns();
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup) {
    return aaco_on_wakeup(args->pid);
}

TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    return aaco_on_wakeup(args->pid);
}

TRACEPOINT_PROBE(task, task_newtask) {
    // `current` is the parent; a thread joins its tgid, a new process is its own tgid.
    u32 child = args->pid;
    u32 tgid = (args->clone_flags & AACO_CLONE_THREAD) ? (u32)(bpf_get_current_pid_tgid() >> 32) : child;
    if (!aaco_wanted(tgid))
        return 0;
    struct aaco_state_t zero = {};
    zero.tgid = tgid;
    state.update(&child, &zero);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u32 tid = args->pid;
    struct aaco_stats_t *s = stats.lookup(&tid);
    if (s)
        s->flags |= ST_EXITED;
#if defined(AACO_HAVE_GROUP_DEAD) && !defined(AACO_ALL_TASKS)
    if (args->group_dead) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        targets.delete(&tgid);
    }
#endif
    return 0;
}

TRACEPOINT_PROBE(exceptions, page_fault_user) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    u32 tgid = id >> 32;
    if (!aaco_wanted(tgid))
        return 0;
    struct aaco_stats_t *s = aaco_stats(tid, tgid);
    if (s)
        s->faults++;
    struct aaco_state_t *st = aaco_state(tid, tgid);
    if (st)
        st->fault_ts = bpf_ktime_get_boot_ns();
    return 0;
}
