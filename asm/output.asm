; output.asm: text to stdout through a small buffer (flushed after every token), the
; --tokens listing, and write_all for every file the engine writes.

OUT_BUF_SIZE = 256

; put_piece: append the text of a token and flush: normal and user-defined pieces with
; U+2581 as a space, byte pieces as their raw byte, other types as nothing.
;   in: eax id < vocab, rbx header, rbp front_base   out: -
;   clobbers: rax rcx rdx rsi rdi r8 r10 r11
put_piece:
        call    piece
        mov     edx, [r11+PIECE_TYPE]
        cmp     edx, PIECE_BYTE
        jne     .text
        sub     eax, [rbx+HDR_BYTE_BASE]
        call    put_byte
        jmp     flush
.text:
        cmp     edx, PIECE_NORMAL
        je      .bytes
        cmp     edx, PIECE_USER
        jne     flush
.bytes:
        mov     rsi, rdi
        mov     r8d, ecx
.next:
        sub     r8d, 1
        jb      flush
        lodsb
        cmp     al, 0xE2
        jne     .put
        cmp     r8d, 2
        jb      .put
        cmp     word [rsi], 0x8196      ; E2 96 81 = U+2581
        jne     .put
        add     rsi, 2
        sub     r8d, 2
        mov     al, ' '
.put:
        call    put_byte
        jmp     .next

; print_ids: the --tokens listing, "id id ... id\n", then exit 0.
;   in: r12 -> ids, r13d = count (>= 1)   out: never returns
print_ids:
        xor     r14d, r14d
.id:
        mov     eax, [r12+r14*4]
        push    10
        pop     r8
        xor     r9d, r9d
.divide:
        xor     edx, edx
        div     r8d
        push    rdx
        inc     r9d
        test    eax, eax
        jnz     .divide
.digit:
        pop     rax
        add     al, '0'
        call    put_byte
        dec     r9d
        jnz     .digit
        inc     r14d
        mov     al, ' '
        cmp     r14d, r13d
        jb      .separator
        mov     al, 10
.separator:
        call    put_byte
        cmp     r14d, r13d
        jb      .id
        jmp     exit_ok

; put_byte: append a byte to out_buf, flushing it when full.
;   in: al, rbp front_base   out: -   clobbers: rax rcx r10 r11
put_byte:
        mov     ecx, [rbp+V_OUT_LEN]
        mov     [rbp+rcx+V_OUT_BUF], al
        inc     ecx
        mov     [rbp+V_OUT_LEN], ecx
        cmp     ecx, OUT_BUF_SIZE
        jb      flush.done
; flush: write out_buf to stdout.
;   in: rbp front_base   out: -   clobbers: rax rcx r10 r11
flush:
        push    rdx
        push    rsi
        push    rdi
        lea     rsi, [rbp+V_OUT_BUF]
        xor     edx, edx
        xchg    edx, [rbp+V_OUT_LEN]
        push    STDOUT
        pop     rdi
        call    write_all
        pop     rdi
        pop     rsi
        pop     rdx
.done:
        ret

; write_all: write rdx bytes from rsi to fd edi, resuming short writes. A reader that went
; away (EPIPE) after something was written (`gemma ... | head -c1`) ends the program quietly
; with status 1; EPIPE before anything got through, and any other failure, is fatal.
;   in: edi fd, rsi buffer, rdx length   out: -   clobbers: rax rcx rdx rsi r10 r11
write_all:
        test    rdx, rdx
        jz      flush.done
        call    sys_write
        cmp     rax, -EPIPE
        je      .gone
        test    rax, rax
        jle     .failed                 ; an error, or no progress
        mov     [rbp+V_WROTE], al
        add     rsi, rax
        sub     rdx, rax
        jmp     write_all
.gone:
        cmp     byte [rbp+V_WROTE], 0
        je      .failed
        push    EXIT_ERROR
        pop     rdi
        jmp     sys_exit
.failed:
        call    fatal_here
        db      'write failed', 0
