; sys.asm: the system interface. The only file that executes `syscall`; everything else
; calls these routines (SysV argument registers; the 4th argument goes in rcx and is moved
; to r10 here). Linux x86-64 syscall numbers below.

SYS_read        = 0
SYS_write       = 1
SYS_open        = 2
SYS_fstat       = 5
SYS_mmap        = 9
SYS_rt_sigprocmask = 14
SYS_madvise     = 28
SYS_dup2        = 33
SYS_clone       = 56
SYS_futex       = 202
SYS_sched_getaffinity = 204
SYS_exit_group  = 231

STDOUT = 1
STDERR = 2

EXIT_ERROR = 1                  ; a bad value, an unreadable or bad file, a failed write
EXIT_USAGE = 2                  ; a malformed command line, or none (usage relies on
                                ; EXIT_USAGE = STDERR)

EPIPE = 32                      ; write to a pipe nobody reads

; fatal_here: print "gemma: MESSAGE\n" on stderr and exit with status 1 (EXIT_ERROR), the
; message the zero-terminated text after `call fatal_here` (without the "gemma: " prefix and
; the newline); while chat.asm reads or tokenizes a turn (chat_rsp set), go on with the next
; turn instead.   in: [rsp] -> the message (rbp anything: threads_start's failing alloc
; comes here with a thread index in it; chat_refused runs in a turn, where rbp is
; front_base)   out: never returns
; fatal_usage_here: the same with status 2 (EXIT_USAGE): a malformed command line.
fatal_usage_here:
        mov     ebx, empty_text         ; no argument
; fatal_usage_arg_here: fatal_arg_here with status 2 (EXIT_USAGE).
fatal_usage_arg_here:
        push    EXIT_USAGE
        jmp     fatal_status
fatal_here:
        mov     ebx, empty_text
; fatal_arg_here: the same with an argument appended, "gemma: MESSAGEARGUMENT\n", the
; argument cut at its first control byte (so that the message stays one line) and at 256
; bytes.   in: [rsp] -> the message, rbx argument (zero-terminated)   out: never returns
fatal_arg_here:
        push    EXIT_ERROR
fatal_status:                           ; [rsp] the status, [rsp+8] -> the message
        pop     r8                      ; (no syscall below changes r8)
        mov     esi, msg_prefix         ; (addresses are below 2^32)
        call    put_err
        pop     rsi                     ; the message
        call    put_err
        push    rbx
        pop     rsi
        mov     cl, ' '
        call    write_until             ; (edi = STDERR still; an empty argument: a write of 0
                                        ; bytes)
        mov     esi, msg_newline
        call    put_err
        mov     edi, r8d
        mov     rcx, [chat_rsp]         ; a conversation's turn being read or tokenized:
        jrcxz   sys_exit                ; that turn is refused, the next one read
        mov     rsp, rcx
        jmp     chat_refused

; put_err: write a zero-terminated string (at most 256 bytes of it) to stderr.
;   in: rsi string   out: edi = STDERR, rax bytes written or -errno   clobbers: rcx rdx r10 r11
put_err:
        push    STDERR
        pop     rdi
; write_str: the same to the file descriptor edi.
write_str:
        mov     cl, 1
; write_until: the same, the string ending at its first byte below cl, or after 256 bytes.
write_until:
        xor     edx, edx
.measure:
        cmp     byte [rsi+rdx], cl
        jb      sys_write
        inc     edx
        test    dh, dh                  ; 256 bytes
        jz      .measure

; Each wrapper loads its syscall number into al and joins sys_call (which zero-extends it).
;   in: rdi rsi rdx rcx r8 r9 the syscall's arguments   out: rax result or -errno, flags of
;   test rax, rax (SF: failed)   clobbers: rcx r10 r11
; sys_write(fd, buf, len); sys_open(path, flags, mode); sys_fstat(fd, statbuf);
; sys_futex(addr, op, val, timeout); sys_mmap(addr, len, prot, flags, fd, off).
sys_write:                              ; (write_until runs on into it)
        mov     al, SYS_write
        jmp     sys_call
sys_open:
        mov     al, SYS_open
        jmp     sys_call
sys_fstat:
        mov     al, SYS_fstat
        jmp     sys_call
; sys_futex_wake: FUTEX_WAKE_PRIVATE (threads.asm) on rdi, waking up to edx waiters.
sys_futex_wake:
        mov     esi, FUTEX_WAKE_PRIVATE
sys_futex:
        mov     al, SYS_futex
        jmp     sys_call
; sys_mmap_0: sys_mmap with addr 0 and offset 0 (sets edi and r9d).
sys_mmap_0:
        xor     edi, edi
        xor     r9d, r9d
sys_mmap:
        mov     al, SYS_mmap
        jmp     sys_call

; usage: print the usage text on stderr and exit with EXIT_USAGE (help in main.asm: on
; stdout, status 0, from .put).
usage:
        push    STDERR
.put:
        pop     rdi
        mov     esi, msg_usage
        call    write_str
        and     edi, EXIT_USAGE         ; STDOUT (1) -> 0; STDERR (2) -> EXIT_USAGE (2)
; sys_exit: exit_group(2), ending every thread.
;   in: edi status   out: never returns
sys_exit:
        mov     al, SYS_exit_group
; sys_call: the system call whose number is in al (a call used once loads al itself:
; madvise(addr, len, advice) in model.asm, rt_sigprocmask and read in main.asm,
; sched_getaffinity(pid, len, mask) and clone(flags, stack) in threads.asm: in the child,
; the `ret` below pops the address stored at [stack]).
;   in: al number, rdi rsi rdx rcx r8 r9   out: rax result or -errno, flags of test rax, rax
;   clobbers: rcx r10 r11
sys_call:
        movzx   eax, al
        mov     r10, rcx
        syscall
        test    rax, rax                ; (callers branch on the sign: -errno)
.ret:
        ret

; alloc: a zeroed, private, anonymous read-write mapping (fd: r8 as it is, which Linux ignores
; with MAP_ANONYMOUS, as the stub's mmap relies on too).
;   in: rdi bytes   out: rax address (fatal "out of memory" on failure), rsi = the bytes
;   clobbers: rcx rdx rdi r9-r11
alloc:
        push    rdi
        pop     rsi
        push    3                       ; PROT_READ | PROT_WRITE
        pop     rdx
        push    0x22                    ; MAP_PRIVATE | MAP_ANONYMOUS
        pop     rcx
        call    sys_mmap_0              ; addr 0, offset 0
        jns     sys_call.ret            ; (else -errno; addresses are below 2^47)

err_oom:
        call    fatal_here
        db      'out of memory', 0

