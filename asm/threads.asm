; threads.asm: the matrix products split by rows over T threads (clone(2) sharing everything),
; and the attention split by (token, head) (forward.asm's att_share), synchronised by futexes.
; The main thread publishes the work in job_vars (vars.asm), bumps job_gen and wakes the
; workers; every thread does its share (job_share: mm_share, att_share); each
; worker counts job_pending down and the last one wakes the main thread, which sleeps until
; it reaches 0. Between products the workers wait on job_gen, looking for a moment, then
; asleep (wait_change). T = 1 makes no thread and no futex call at all.

CLONE_THREADS = 0x50F00         ; CLONE_VM FS FILES SIGHAND THREAD SYSVSEM
FUTEX_WAIT_PRIVATE = 128
FUTEX_WAKE_PRIVATE = 129
WORKER_STACK = 16384
CPU_MASK_BYTES = 128            ; room for 1024 CPUs
SPIN_ROUNDS = 4096              ; wait_change: about 0.1 ms of pause instructions

; threads_start: resolve T (-t, else the CPUs this process may run on: sched_getaffinity;
; 1 if that fails), choose how long waits look before they sleep (job_spin: SPIN_ROUNDS, or 1
; when T exceeds those CPUs: a looking thread would take a CPU from a working one) and start
; the T - 1 workers, each on its own stack from alloc, index 1 first; where clone fails, T
; becomes the threads started (any T computes the same results). A worker inherits the
; registers of the clone: rbx job_vars, ebp its index, r12d 0 (its last job done).
;   in: n_threads (0: not given; rbp front_base), r12d 0 (model_setup's slot loop ends so)
;   out: job_t = T, job_spin
;   clobbers: rax rcx rdx rsi rdi rbp r8-r11
threads_start:
        push    rbx
        mov     ebx, job_vars
        xor     edi, edi                ; this process
        mov     esi, CPU_MASK_BYTES
        lea     rdx, [rbx+cpu_mask-job_vars]
        mov     al, SYS_sched_getaffinity ; (its only call: no wrapper)
        call    sys_call                ; bytes of mask written, or -errno
        mov     eax, CPU_MASK_BYTES * 8 - 1 ; (the bytes it did not write: 0, bss; all of
        xor     ecx, ecx                ; them when it failed)
.bit:
        bt      [rdx], eax
        adc     ecx, 0
        dec     eax
        jns     .bit
        cmp     ecx, 1
        adc     ecx, 0                  ; CPUs: at least 1
        mov     ebp, [rbp+V_THREADS]
        test    ebp, ebp
        cmovz   ebp, ecx
        mov     eax, SPIN_ROUNDS
        cmp     ecx, ebp
        jae     .spawn
        push    1                       ; more threads than CPUs: sleep at once
        pop     rax
.spawn:
        mov     [rbx+J_SPIN], eax
        mov     [rbx+J_T], ebp
        xor     ebp, ebp
.worker:
        inc     ebp                     ; the next worker's index, 1 .. T-1
        cmp     ebp, [rbx+J_T]
        jae     .done
        mov     edi, WORKER_STACK
        call    alloc                   ; rsi = WORKER_STACK
        lea     rsi, [rax+rsi-8]
        mov     qword [rsi], worker     ; the child's `ret` in sys_call enters worker
        mov     edi, CLONE_THREADS
        mov     al, SYS_clone           ; (its only call: no wrapper)
        call    sys_call                ; (flags: test rax, rax)
        jns     .worker
        mov     [rbx+J_T], ebp          ; clone failed: T is the threads running, 0 .. ebp-1
.done:
        pop     rbx
        ret

; worker: a thread's whole life (never returns): sleep until job_gen moves, do share k,
; count job_pending down; the last one wakes the main thread.
;   in: rbx job_vars, ebp k (1 .. T-1), r12d 0: the last job done (job_gen starts at 0;
;   threads_start's r12d), rsp 0 mod 16 (entered by `ret`: no return address)
worker:
.next:
        lea     rdi, [rbx+J_GEN]
        mov     edx, r12d
        call    wait_change
        mov     r12d, [rdi]
        mov     esi, ebp
        call    qword [rbx+J_SHARE]
        lea     rdi, [rbx+J_PENDING]
        lock dec dword [rdi]
        jnz     .next
        mov     edx, ebp                ; k >= 1: wakes the main thread, its only waiter
        call    sys_futex_wake
        jmp     .next

; par_matmul: matmul_f16's product for B tokens, by the chosen kernel (cpu.asm), rows split
; over T threads: xout (B,d) = rows of W (d,n) @ each of x (B,n).
;   in: rdi xout, rsi x, rdx W, ecx n, r8d d, r9d accumulate (as matmul_f16), eax B,
;   r10 bytes per row of W, r11 its kernel record (job_kernel or job_kernel_q8), job_gate
;   (mm_share)
;   out: xout; job_gate = 0 again
;   clobbers: rax rcx rdx rsi rdi r8-r11 xmm0-xmm15
par_matmul:
        push    rbx
        mov     ebx, job_vars
        mov     [rbx+J_B], eax
        mov     [rbx+J_OUT], rdi
        mov     [rbx+J_X], rsi
        mov     [rbx+J_W], rdx
        mov     [rbx+J_N], ecx
        mov     [rbx+J_D], r8d
        mov     [rbx+J_ACC], r9d
        mov     [rbx+J_ROWB], r10
        mov     [rbx+J_CALL], r11
        mov     eax, mm_share
        jmp     par_run.go

; par_run: every thread runs the share function for its k (this one k = 0, then it waits for
; the others: job_pending reaches 0).
;   in: rax the share function (SysV, esi k, rbx job_vars; keeps rbx rbp r12-r15), the work
;   published in job_vars / fwd_vars   out: job_gate = 0
;   clobbers: rax rcx rdx rsi rdi r8-r11 xmm0-xmm15
par_run:
        push    rbx
        mov     ebx, job_vars
.go:
        mov     [rbx+J_SHARE], rax
        mov     edx, [rbx+J_T]
        dec     edx                     ; workers
        jz      .own
        mov     [rbx+J_PENDING], edx
        lea     rdi, [rbx+J_GEN]
        inc     dword [rdi]             ; published (stores are seen in order)
        call    sys_futex_wake          ; wake edx workers
.own:
        xor     esi, esi                ; the main thread's share: k = 0
        call    qword [rbx+J_SHARE]
        lea     rdi, [rbx+J_PENDING]
.wait:
        mov     edx, [rdi]
        test    edx, edx
        jz      .done
        call    wait_change
        jmp     .wait
.done:
        mov     [rbx+J_GATE], rdx       ; 0: a gate serves one product
        pop     rbx
        ret

; wait_change: wait until the dword at rdi is no longer edx: first by looking, job_spin
; times (a product's share is often shorter than a futex wake-up: on Gemma 3 270M, 2 threads,
; decode went 1.3-1.5x as fast with the look), then asleep (FUTEX_WAIT), and after a wake-up
; the same again (its first look sees the change a wake-up follows).
;   in: rdi address, edx value, rbx job_vars   clobbers: rax rcx rsi r10 r11
wait_change:
        mov     ecx, [rbx+J_SPIN]
.look:
        cmp     [rdi], edx
        jne     .ret
        pause
        loop    .look
        mov     esi, FUTEX_WAIT_PRIVATE ; (ecx = 0: no timeout; the kernel sleeps only
        call    sys_futex               ; while the dword is still edx)
        jmp     wait_change             ; woken: look again
.ret:
        ret

; mm_share: thread k's rows of the published product: [k c, min(d, (k+1) c)), c = ceil(d/T)
; rounded up to a multiple of 4 (so every share but the last decodes in the FP16 kernel's
; four-row passes, whatever T), none when k c >= d; in chunks of MM_CHUNK rows, each chunk
; for every token in turn (its weights come from memory once, then from the cache; a call's
; x stays in the cache for all its rows: against 16 rows, 128 ran the 2b FP16 prompt
; 1.05-1.07x and Q8_0 1.02-1.03x on 1 and 2 threads with 4-token calls, AVX-512 Intel host;
; 256 no faster; with the AVX-512 kernels' 8-token calls 96 and 128 alike, and 96 = 32 of
; their 3-row tiles); the kernel record's tokens a call while as many are left, then the
; rest, FAST_TOKENS at most a call (AVX-512: 5-7 left go 4 + 1-3; AVX2 FP16: 21 x 3 + 1
; for 64, its lone last token as fast as 20 x 3 + 4 was); for one token (decode), all of k's
; rows in one chunk.
; With job_gate set, each chunk done then gets gate = gelu_tanh(gate) * xout on its rows, in
; the cache and on every thread (GEGLU: the same operations as one geglu call over all).
;   in: esi k, rbx job_vars   out: those rows of xout
;   clobbers: rax rcx rdx rsi rdi r8-r11 xmm0-xmm15
MM_CHUNK = 96
mm_share:
        mov     ecx, [rbx+J_T]
        mov     edi, [rbx+J_D]
        lea     eax, [rdi+rcx-1]
        cdq                             ; (d + T - 1 < 2^31)
        div     ecx
        add     eax, 3
        and     al, -4                  ; c
        imul    esi, eax                ; the first row
        sub     edi, esi                ; rows left
        jbe     wait_change.ret         ; none for k
        cmp     edi, eax
        cmova   edi, eax
        push    rbp
        push    r12
        push    r13
        push    r14
        mov     r13d, edi               ; rows left
        mov     r12d, esi               ; the chunk's first row
        push    MM_CHUNK                ; a chunk's rows: all for one token (decode:
        pop     r14                     ; matmul_q8_avx2 reads rows half the share apart),
        cmp     dword [rbx+J_B], 1      ; else MM_CHUNK at most
        cmove   r14d, edi
.chunk:
        cmp     r14d, r13d              ; the last chunk: the rows left
        cmova   r14d, r13d
        xor     ebp, ebp                ; token
.token:
        mov     r8d, r14d               ; rows
        mov     eax, [rbx+J_D]
        shl     eax, 2
        push    rax                     ; the kernel's ostride: bytes of an xout row
        imul    eax, ebp
        lea     eax, [rax+r12*4]
        add     rax, [rbx+J_OUT]
        xchg    rdi, rax                ; xout + (t d + row) * 4
        mov     ecx, [rbx+J_N]
        mov     eax, ebp
        imul    eax, ecx
        mov     rsi, [rbx+J_X]
        lea     rsi, [rsi+rax*4]        ; x + t n * 4
        mov     eax, r12d
        imul    rax, [rbx+J_ROWB]
        mov     rdx, [rbx+J_W]
        add     rdx, rax                ; W + row (bytes per row)
        mov     r11, [rbx+J_CALL]       ; the kernel record
        mov     eax, [rbx+J_B]
        sub     eax, ebp                ; tokens left: the record's tokens if as many are
        cmp     eax, [r11+KREC_TOKENS]  ; left, else all of them, at most FAST_TOKENS
        jae     .record
        cmp     al, FAST_TOKENS
        jbe     .take
        mov     al, FAST_TOKENS
        jmp     .take
.record:
        mov     eax, [r11+KREC_TOKENS]
.take:
        push    rax                     ; the kernel's tokens
        mov     r9d, [rbx+J_ACC]
        call    qword [r11]
        pop     rax
        pop     rcx
        add     ebp, eax
        cmp     ebp, [rbx+J_B]
        jb      .token
        cmp     qword [rbx+J_GATE], 0
        jne     .gelu
.next:
        add     r12d, r14d
        sub     r13d, r14d
        jg      .chunk
        pop     r14
        pop     r13
        pop     r12
        pop     rbp
        ret
.gelu:                                  ; the chunk's rows of every token, from the last
        dec     ebp
        js      .next
        mov     eax, [rbx+J_D]
        imul    eax, ebp
        add     eax, r12d               ; t d + row
        mov     rdi, [rbx+J_GATE]
        lea     rdi, [rdi+rax*4]
        mov     rsi, [rbx+J_OUT]
        lea     rsi, [rsi+rax*4]
        mov     edx, r14d
        call    geglu                   ; gate = gelu_tanh(gate) * xout (kernels.asm)
        jmp     .gelu
