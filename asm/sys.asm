; sys.asm: the system interface. The only file that executes `syscall`; everything else
; calls these routines. Linux x86-64 syscall numbers below.

SYS_write      = 1
SYS_exit_group = 231

STDOUT = 1
STDERR = 2

EXIT_ERROR = 1                  ; bad input, unreadable model, failed write
EXIT_USAGE = 2                  ; no arguments

; write_str: write a zero-terminated string to a file descriptor.
;   in: edi fd, rsi string   out: rax bytes written or -errno   clobbers: rcx rdx r11
write_str:
        xor     edx, edx
.measure:
        cmp     byte [rsi+rdx], 0
        je      sys_write
        inc     edx
        jmp     .measure

; sys_write: write(2).
;   in: edi fd, rsi buffer, rdx length   out: rax bytes written or -errno   clobbers: rcx r11
sys_write:
        mov     eax, SYS_write
        syscall
        ret

; fatal: print a zero-terminated message on stderr and exit.
;   in: rsi message, ebx exit status   out: never returns
fatal:
        mov     edi, STDERR
        call    write_str
        mov     edi, ebx
; sys_exit: exit_group(2), ending every thread.
;   in: edi status   out: never returns
sys_exit:
        mov     eax, SYS_exit_group
        syscall
