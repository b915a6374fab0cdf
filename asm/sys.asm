; sys.asm: the system interface. The only file that executes `syscall`; everything else
; calls these routines (SysV argument registers; the 4th argument goes in rcx and is moved
; to r10 here). Linux x86-64 syscall numbers below.

SYS_write       = 1
SYS_open        = 2
SYS_fstat       = 5
SYS_mmap        = 9
SYS_rt_sigprocmask = 14
SYS_madvise     = 28
SYS_exit_group  = 231

STDOUT = 1
STDERR = 2

EXIT_ERROR = 1                  ; bad input, unreadable model, failed write
EXIT_USAGE = 2                  ; no arguments

EPIPE = 32                      ; write to a pipe nobody reads

; Each wrapper pushes its syscall number and joins sys_call.
;   in: rdi rsi rdx rcx r8 r9 the syscall's arguments   out: rax result or -errno
;   clobbers: rcx r10 r11
; sys_open(path, flags, mode); sys_fstat(fd, statbuf);
; sys_write(fd, buf, len); sys_sigprocmask(how, set, oldset, setsize);
; sys_mmap(addr, len, prot, flags, fd, off); sys_madvise(addr, len, advice).
sys_open:
        push    SYS_open
        jmp     sys_call
sys_fstat:
        push    SYS_fstat
        jmp     sys_call
sys_write:
        push    SYS_write
        jmp     sys_call
sys_sigprocmask:
        push    SYS_rt_sigprocmask
        jmp     sys_call
sys_madvise:
        push    SYS_madvise
        jmp     sys_call
sys_mmap:
        push    SYS_mmap
sys_call:
        pop     rax
        mov     r10, rcx
        syscall
        ret

; alloc: a zeroed, private, anonymous read-write mapping.
;   in: rdi bytes   out: rax address (fatal "out of memory" on failure)
;   clobbers: rcx rdx rsi rdi r8-r11
alloc:
        mov     rsi, rdi
        xor     edi, edi
        push    3                       ; PROT_READ | PROT_WRITE
        pop     rdx
        push    0x22                    ; MAP_PRIVATE | MAP_ANONYMOUS
        pop     rcx
        or      r8, -1                  ; no file
        xor     r9d, r9d
        call    sys_mmap
        test    rax, rax                ; -errno; addresses are below 2^47
        js      err_oom
        ret

; write_str: write a zero-terminated string to a file descriptor.
;   in: edi fd, rsi string   out: rax bytes written or -errno   clobbers: rcx rdx r10 r11
write_str:
        mov     cl, 1
; write_until: the same, the string ending at its first byte below cl, or after 256 bytes.
write_until:
        xor     edx, edx
.measure:
        cmp     byte [rsi+rdx], cl
        jb      sys_write
        test    dh, dh
        jnz     sys_write
        inc     edx
        jmp     .measure

err_oom:
        call    fatal_here
        db      'out of memory', 0

; fatal_here: fatal with the message that follows the call instruction.
;   in: [rsp] -> the zero-terminated message after `call fatal_here`   out: never returns
fatal_here:
        pop     rsi
; fatal: print "gemma: MESSAGE\n" on stderr and exit with status 1 (EXIT_ERROR).
;   in: rsi message (zero-terminated, without the "gemma: " prefix and the newline)
;   out: never returns. (ebx is ignored: every error exits with EXIT_ERROR.)
fatal:
        xor     ebx, ebx
        jmp     fatal_arg
; fatal_arg_here: fatal_arg with the message that follows the call instruction.
fatal_arg_here:
        pop     rsi
; fatal_arg: the same with an argument appended, "gemma: MESSAGEARGUMENT\n", the argument
; cut at its first control byte (so that the message stays one line) and at 256 bytes.
;   in: rsi message, rbx argument (zero-terminated) or 0   out: never returns
fatal_arg:
        push    rsi
        lea     rsi, [msg_prefix]
        call    .put
        pop     rsi
        call    .put
        mov     rsi, rbx
        test    rsi, rsi
        jz      .newline
        mov     cl, ' '
        call    .put_until
.newline:
        lea     rsi, [msg_newline]
        call    .put
        push    EXIT_ERROR
        pop     rdi
        jmp     sys_exit
.put:
        mov     cl, 1
.put_until:
        push    STDERR
        pop     rdi
        jmp     write_until

; usage: print the usage text on stderr and exit with EXIT_USAGE.
usage:
        lea     rsi, [msg_usage]
        push    STDERR
        pop     rdi
        call    write_str
        push    EXIT_USAGE
        pop     rdi
; sys_exit: exit_group(2), ending every thread.
;   in: edi status   out: never returns
sys_exit:
        mov     eax, SYS_exit_group
        syscall

; ---- threads (W-fast) ---
; sys_sched_getaffinity(pid, len, mask); sys_futex(addr, op, val, timeout);
; sys_clone(flags, stack, ...): in the child, `ret` pops the address stored at [stack].
; As above: in: rdi rsi rdx rcx r8 r9   out: rax result or -errno   clobbers: rcx r10 r11
SYS_clone       = 56
SYS_futex       = 202
SYS_sched_getaffinity = 204

sys_sched_getaffinity:
        mov     eax, SYS_sched_getaffinity
        jmp     sys_nr
; sys_futex_wake: FUTEX_WAKE_PRIVATE (threads.asm) on rdi, waking up to edx waiters.
sys_futex_wake:
        mov     esi, FUTEX_WAKE_PRIVATE
sys_futex:
        mov     eax, SYS_futex
        jmp     sys_nr
sys_clone:
        push    SYS_clone
        pop     rax
; sys_nr: the system call whose number is in eax (sys_call's tail again: from here a jump
; to sys_call would not be short, so the copy is smaller).
;   in: eax number, rdi rsi rdx rcx r8 r9   out: rax result or -errno   clobbers: rcx r10 r11
sys_nr:
        mov     r10, rcx
        syscall
        ret
