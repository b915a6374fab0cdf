; output.asm: text to stdout through a small buffer (flushed after every token) and
; write_all for every file the engine writes.

OUT_BUF_SIZE = 128              ; (put_byte tests bit 7 of the length's byte: its sign)

; put_piece: append the text of a token and flush: normal and user-defined pieces with
; U+2581 as a space, byte pieces as their raw byte, other types as nothing.
;   in: eax id < vocab, rbx header, rbp front_base   out: -
;   clobbers: rax rcx rdx rsi rdi r10 r11
put_piece:
        call    piece
        mov     edx, [r11+PIECE_TYPE]
        sub     edx, PIECE_BYTE
        jnz     .text
        sub     eax, [rbx+HDR_BYTE_BASE]        ; edx = 0: no byte follows
        jmp     .put
.text:
        cmp     edx, PIECE_NORMAL - PIECE_BYTE
        je      .bytes
        cmp     edx, PIECE_USER - PIECE_BYTE
        jne     flush
.bytes:
        push    rdi
        pop     rsi
        mov     edx, ecx
.next:                                  ; edx = bytes left, rsi -> them
        dec     edx
        js      flush
        lodsb
        cmp     al, 0xE2
        jne     .put
        cmp     edx, 2
        jb      .put
        cmp     word [rsi], 0x8196      ; E2 96 81 = U+2581
        jne     .put
        lodsw
        sub     edx, 2
        mov     al, ' '
.put:
        call    put_byte
        jmp     .next

; put_byte: append a byte to out_buf, flushing it when full.
;   in: al, rbp front_base   out: -   clobbers: rax rcx rdi r10 r11
put_byte:
        mov     ecx, [rbp+V_OUT_LEN]
        mov     [rbp+rcx+V_OUT_BUF], al
        inc     byte [rbp+V_OUT_LEN]
        jns     flush.done              ; (OUT_BUF_SIZE bytes: the sign)
; flush: write out_buf to stdout.
;   in: rbp front_base   out: -   clobbers: rax rcx rdi r10 r11
flush:
        push    rdx
        push    rsi
        lea     esi, [rbp+V_OUT_BUF]    ; (rbp < 2^32)
        xor     edx, edx
        xchg    edx, [rbp+V_OUT_LEN]
        push    STDOUT
        pop     rdi
        call    write_all
        pop     rsi
        pop     rdx
.done:
        ret

; write_all: write edx bytes from rsi to fd edi, resuming short writes. A reader that went
; away (EPIPE) after something was written (`gemma ... | head -c1`) ends the program quietly
; with status 1; EPIPE before anything got through, and any other failure, is fatal.
;   in: edi fd, rsi buffer, edx length   out: -   clobbers: rax rcx rdx rsi r10 r11
write_all:
        test    edx, edx
        jz      flush.done
        call    sys_write               ; (flags: test rax, rax)
        jle     .error                  ; an error, or no progress
        mov     [rbp+V_WROTE], eax      ; (a count: never 0)
        add     rsi, rax
        sub     edx, eax
        jmp     write_all
.error:
        cmp     eax, -EPIPE             ; (counts are below 2^31: eax tells)
        jne     .failed
        cmp     dword [rbp+V_WROTE], 0  ; EPIPE: gone after something got through?
        je      .failed
        push    EXIT_ERROR
        pop     rdi
        jmp     sys_exit
.failed:
        call    fatal_here
        db      'write failed', 0
