// AACO sched source: the task-storage program (bcc-compiled; its functions are loaded as BTF-typed
// programs by aaco.agent.sources.sched.task_prog, since bcc itself attaches none of these kinds).
//
// Where the kernel allows it, this replaces sched_bpf.c (docs/sched.md, "Task storage"):
// - BTF-typed tracepoints (tp_btf) on sched_switch, task_newtask, sched_process_exec,
//   sched_process_exit and page_fault_user: their task arguments are typed pointers, read with
//   plain loads where sched_bpf.c needs a bpf_probe_read_kernel call per field;
// - each thread's entry is task-local storage, found from the task itself, with no hash lookup;
// - no clock is read on a switch: the slice is the kernel's own sum_exec_runtime delta (what
//   /proc/<pid>/schedstat reports as time on CPU), it began at sched_info.last_arrival (the
//   runqueue clock), so the thread left its CPU at last_arrival + slice, and the gap to its next
//   last_arrival is its off-CPU interval. Runqueue waits are sched_info's pcount and run_delay, as
//   in sched_bpf.c with AACO_SCHED_INFO_OFF. A published off-CPU interval alone reads the boot
//   clock, to place its ends on it;
// - user space reads the entries with a task iterator (aaco_iter_task: one record per traced
//   thread, written to the iterator's seq_file) instead of a map lookup; a thread's final switch
//   copies its entry into `exited` (keyed by tid), since its storage is freed with the task.
//
// Settings (cflags, besides sched_common.h's): AACO_MAX_EXITED, AACO_PID_OFF, AACO_TGID_OFF,
// AACO_COMM_OFF, AACO_SCHED_INFO_OFF, AACO_SUM_EXEC_OFF (offsets in the running kernel's
// struct task_struct, from its BTF).

#define AACO_U64(task, off) (*(u64 *)((char *)(task) + (off)))
#define AACO_U32(task, off) (*(u32 *)((char *)(task) + (off)))
#define AACO_LAST_ARRIVAL 32  // sched_info.last_arrival (checked against BTF by the agent)

BPF_TASK_STORAGE(threads, struct aaco_thread_t);
BPF_HASH(exited, u64, struct aaco_thread_t, AACO_MAX_EXITED);
#ifndef AACO_ALL_TASKS
// Tracing targets only: a task found not to be one is marked with the targets' generation (+1),
// which the agent bumps whenever it changes `targets`, so its later switches skip the hash lookup.
BPF_TASK_STORAGE(untraced, u32);
BPF_ARRAY(generation, u32, 1);
#endif

// The iterator's context (struct bpf_iter__task, whose kernel definition is not in any header).
struct aaco_iter_meta {
    void *seq;
    u64 session_id;
    u64 seq_num;
};
struct aaco_iter_task {
    struct aaco_iter_meta *meta;
    struct task_struct *task;
};

// `task`'s entry, made when its process is traced; a thread first seen mid-life starts from the
// kernel's values now (so its history before is not counted). Tracing targets only, a task that
// is not one costs a second storage lookup, not a hash lookup, once marked (`untraced`).
static __always_inline struct aaco_thread_t *aaco_entry(struct task_struct *task) {
    struct aaco_thread_t *t = threads.task_storage_get(task, 0, 0);
    if (t)
        return t;
    u32 tgid = AACO_U32(task, AACO_TGID_OFF);
#ifdef AACO_ALL_TASKS
    if (tgid == 0)
        return NULL;
#else
    u32 zero = 0;
    u32 *gen = generation.lookup(&zero);
    u32 *mark = untraced.task_storage_get(task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!gen || (mark && *mark == *gen + 1))
        return NULL;
    if (!aaco_wanted(tgid)) {
        if (mark)
            *mark = *gen + 1;
        return NULL;
    }
#endif
    t = threads.task_storage_get(task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!t) {
        aaco_count(CNT_THREADS_FULL);
        return NULL;
    }
    t->tid = AACO_U32(task, AACO_PID_OFF);
    t->tgid = tgid;
    t->sum_exec = AACO_U64(task, AACO_SUM_EXEC_OFF);
    t->pcount = AACO_U64(task, AACO_SCHED_INFO_OFF);
    t->run_delay = AACO_U64(task, AACO_SCHED_INFO_OFF + 8);
    t->flags = ST_INFO_SEEN;
    bpf_probe_read_kernel(&t->comm, sizeof(t->comm), (char *)task + AACO_COMM_OFF);
    return t;
}

// (bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
int aaco_task_switch(u64 *ctx) {
    struct task_struct *prev = (struct task_struct *)ctx[1];
    u64 state = ctx[3];
    if (AACO_U32(prev, AACO_PID_OFF) == 0)
        return 0;  // the idle task
    int dead = (state & AACO_TASK_DEAD) != 0;
    struct aaco_thread_t *t = dead ? threads.task_storage_get(prev, 0, 0) : aaco_entry(prev);
    if (!t)
        return 0;
    u64 sum = AACO_U64(prev, AACO_SUM_EXEC_OFF);
    u64 arrival = AACO_U64(prev, AACO_SCHED_INFO_OFF + AACO_LAST_ARRIVAL);
    u64 slice = sum > t->sum_exec ? sum - t->sum_exec : 0;
    u64 now = arrival + slice;  // on the runqueue clock (the slice is task time: interrupts left out)
    t->oncpu_ns += slice;
    t->sum_exec = sum;
    s64 boot_shift = 0;  // runqueue clock -> boot clock, read only for an interval to be published
#if AACO_OFFCPU_MIN_NS > 0
    if (t->out_ts && arrival >= t->out_ts + AACO_OFFCPU_MIN_NS)
        boot_shift = (s64)(bpf_ktime_get_boot_ns() - now);
#endif
    aaco_gap(t, arrival, boot_shift);
    aaco_sched_info(t, AACO_U64(prev, AACO_SCHED_INFO_OFF), AACO_U64(prev, AACO_SCHED_INFO_OFF + 8));
    if (dead) {
        // The storage goes with the task: its final counters wait in `exited` for the agent.
        t->flags |= ST_EXITED;
        u64 tid = t->tid;
        if (exited.update(&tid, t) != 0)
            aaco_count(CNT_THREADS_FULL);
        return 0;
    }
    // As the kernel counts them: a switch is voluntary when not preempted and the task was not runnable.
    int involuntary = ctx[0] || state == 0;
    aaco_switched_out(t, involuntary, !involuntary && (state & AACO_UNINTERRUPTIBLE), now);
    return 0;
}

// (struct task_struct *task, unsigned long clone_flags): a new thread of a traced process is
// traced from birth, its first runqueue wait included.
int aaco_task_newtask(u64 *ctx) {
    struct task_struct *task = (struct task_struct *)ctx[0];
    u32 tid = AACO_U32(task, AACO_PID_OFF);
    u32 tgid = (ctx[1] & AACO_CLONE_THREAD) ? (u32)(bpf_get_current_pid_tgid() >> 32) : tid;
    if (!aaco_wanted(tgid))
        return 0;
    struct aaco_thread_t *t = threads.task_storage_get(task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!t) {
        aaco_count(CNT_THREADS_FULL);
        return 0;
    }
    t->tid = tid;
    t->tgid = tgid;
    t->flags = ST_INFO_SEEN;
    bpf_get_current_comm(&t->comm, sizeof(t->comm));
    return 0;
}

// (struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm): a new name.
int aaco_task_exec(u64 *ctx) {
    struct aaco_thread_t *t = threads.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, 0);
    if (t)
        bpf_get_current_comm(&t->comm, sizeof(t->comm));
    return 0;
}

// (struct task_struct *p, bool group_dead): a process whose last thread exits leaves the targets.
int aaco_task_exit(u64 *ctx) {
#ifndef AACO_ALL_TASKS
    if (ctx[1]) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        targets.delete(&tgid);
    }
#endif
    return 0;
}

// (unsigned long address, struct pt_regs *regs, unsigned long error_code)
int aaco_task_fault(u64 *ctx) {
    struct aaco_thread_t *t = aaco_entry((struct task_struct *)bpf_get_current_task_btf());
    if (t) {
        t->faults++;
        t->fault_ts = 1;
    }
    return 0;
}

// One record per traced thread, its name refreshed; entries of processes no longer traced are dropped.
int aaco_iter_task(struct aaco_iter_task *ctx) {
    struct task_struct *task = ctx->task;
    if (!task)
        return 0;
    struct aaco_thread_t *t = threads.task_storage_get(task, 0, 0);
    if (!t)
        return 0;
#ifndef AACO_ALL_TASKS
    if (!aaco_wanted(t->tgid)) {
        threads.task_storage_delete(task);
        return 0;
    }
#endif
    bpf_probe_read_kernel(&t->comm, sizeof(t->comm), (char *)task + AACO_COMM_OFF);
    bpf_seq_write(ctx->meta->seq, t, sizeof(*t));
    return 0;
}
