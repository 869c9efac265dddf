// AACO sched source: what its two eBPF programs share (bcc), prepended to each by
// aaco.agent.sources.sched.ebpf: sched_bpf.c (raw or classic tracepoints, threads in an LRU hash)
// and sched_task.c (BTF-typed tracepoints, threads in task-local storage). See docs/sched.md.
//
// Settings (cflags): AACO_MAX_TARGETS, AACO_OFFCPU_MIN_NS, AACO_RINGBUF_PAGES, AACO_ALL_TASKS
// (defined or not); each program names its own.

#define AACO_STATE_MASK 0xff        // classic prev_state bits of a sleeping task; 0: runnable (preempted or yielded)
#define AACO_UNINTERRUPTIBLE 0x2    // TASK_UNINTERRUPTIBLE, both as reported ("D") and raw
#define AACO_DEAD_MASK 0x30         // classic: EXIT_DEAD ("X") | EXIT_ZOMBIE ("Z"): the task's final switch
#define AACO_TASK_DEAD 0x80         // raw: TASK_DEAD in __state
#define AACO_CLONE_THREAD 0x10000ULL
#define AACO_HIST_SLOTS 40          // log2 slots of a wait in ns; the last also holds longer waits (>= 2^39 ns)

#define ST_FAULT_BLOCK 1  // the last switch-out was an uninterruptible sleep after a page fault in the same slice
#define ST_EXITED 2       // the thread's final switch was seen: the agent reads the entry once more, then deletes it
#define ST_INFO_SEEN 4    // pcount and run_delay hold the kernel's values at the last switch-out

#define CNT_RINGBUF_LOST 0
#define CNT_THREADS_FULL 1

// One entry per thread: cumulative counters (the agent reads them), then timing state. The
// histogram's counts are u32 (the agent takes their deltas modulo 2^32) to keep the entry small.
struct aaco_thread_t {
    u64 oncpu_ns;
    u64 offcpu_ns;
    u64 rq_wait_ns;
    u64 fault_offcpu_ns;
    u64 voluntary;
    u64 involuntary;
    u64 faults;
    u64 rq_count;
    u32 tid;
    u32 tgid;      // 0 until known
    u32 flags;
    u32 pad;
    char comm[16];
    u64 out_ts;    // switched out at (0: not seen switching out yet)
    u64 ready_ts;  // runnable since (wakeup or preemption; 0: not waiting); without sched_info
    u64 fault_ts;  // non-zero: a user page fault in the current slice (its time, where a clock is read)
    u64 pcount;    // sched_info.pcount at the last switch-out (ST_INFO_SEEN)
    u64 run_delay; // sched_info.run_delay at the last switch-out (ST_INFO_SEEN)
    u64 sum_exec;  // se.sum_exec_runtime at the last switch-out (task storage only)
    u32 hist[AACO_HIST_SLOTS];
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

static __always_inline void aaco_wait(struct aaco_thread_t *t, u64 wait, u64 waits) {
    t->rq_wait_ns += wait;
    t->rq_count += waits;
    u32 slot = bpf_log2l(waits > 1 ? wait / waits : wait);
    if (slot >= AACO_HIST_SLOTS)
        slot = AACO_HIST_SLOTS - 1;
    t->hist[slot] += waits;
}

// The kernel's own runqueue accounting (sched_info's pcount, run_delay): the waits, and their
// total, since the thread's previous switch-out.
static __always_inline void aaco_sched_info(struct aaco_thread_t *t, u64 pcount, u64 run_delay) {
    if ((t->flags & ST_INFO_SEEN) && pcount > t->pcount && run_delay >= t->run_delay)
        aaco_wait(t, run_delay - t->run_delay, pcount - t->pcount);
    t->pcount = pcount;
    t->run_delay = run_delay;
    t->flags |= ST_INFO_SEEN;
}

// The gap before the slice that began at `in_ts`: an off-CPU interval since the last switch-out.
// Its event (when long enough) is published on the boot clock: `boot_shift` is added to both ends.
static __always_inline void aaco_gap(struct aaco_thread_t *t, u64 in_ts, s64 boot_shift) {
    if (!t->out_ts || in_ts <= t->out_ts)
        return;
    u64 off = in_ts - t->out_ts;
    t->offcpu_ns += off;
    if (t->flags & ST_FAULT_BLOCK)
        t->fault_offcpu_ns += off;
#if AACO_OFFCPU_MIN_NS > 0
    if (off >= AACO_OFFCPU_MIN_NS) {
        struct aaco_offcpu_event_t *e = offcpu_events.ringbuf_reserve(sizeof(*e));
        if (e) {
            e->start_ns = t->out_ts + boot_shift;
            e->end_ns = in_ts + boot_shift;
            e->tgid = t->tgid;
            e->tid = t->tid;
            e->flags = t->flags;
            e->pad = 0;
            __builtin_memcpy(e->comm, t->comm, sizeof(e->comm));
            offcpu_events.ringbuf_submit(e, 0);
        } else {
            aaco_count(CNT_RINGBUF_LOST);
        }
    }
#endif
}

// A switch-out that is not the thread's last: its kind, and whether it blocks after a fault.
static __always_inline void aaco_switched_out(struct aaco_thread_t *t, int involuntary, int uninterruptible, u64 now) {
    if (involuntary) {
        t->involuntary++;
        t->flags &= ~ST_FAULT_BLOCK;
    } else {
        t->voluntary++;
        if (uninterruptible && t->fault_ts)
            t->flags |= ST_FAULT_BLOCK;
        else
            t->flags &= ~ST_FAULT_BLOCK;
    }
    t->fault_ts = 0;
    t->out_ts = now;
}
