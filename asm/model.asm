; model.asm: open and map the model file read-only, and validate its header and tokenizer
; tables against the real file size before anything else reads them (format.asm).

O_NONBLOCK = 0x800              ; O_RDONLY | O_NONBLOCK: a FIFO named by -m cannot block us
ST_DEV  = 0                     ; struct stat (x86-64): u64 st_dev
ST_INO  = 8                     ; u64 st_ino
ST_MODE = 24                    ; u32 st_mode
ST_SIZE = 48                    ; s64 st_size
S_IFMT  = 0xF000
S_IFREG = 0x8000
MADV_HUGEPAGE = 14              ; where the kernel allows it (THP "madvise" or "always"), the
                                ; model's pages read from disk through this mapping go into the
                                ; page cache as 2 MB folios, and every later run maps them 2 MB
                                ; per fault: measured 0.035 s instead of 0.55 s for Gemma-2B

err_cannot_read:                        ; (before load_model: its jumps here are short)
        call    fatal_arg_here
        db      'cannot read ', 0

; load_model: map the file named by -m (asking for huge pages) and validate it (docs/format.md,
; "Version 4"): sets model_base and the sections' pointers (slots_ptr ..
; weights_ptr). Checks, in order: size >= the header (else truncated), magic, version,
; header_size, file_size == the real size (larger: truncated), vocab below 2^24, max_ctx
; 1 .. 2^16, n_slots 1 .. 255, n_ops 1 .. 2^16, no flag but MERGES, n_merges 0 without it
; and <= 2^24 with it, bos/eos/eot < vocab, byte_base + 256 <= vocab, each section where the
; one before ends (slots, program, strings, pieces, index, user, merges, blob; weights at the
; next multiple of 4096), the last ending at file_size, every index id < vocab, every merge's
; left, right and result < vocab and the merges strictly sorted by (left, right) (the
; tokenizer's binary search), the strings section's N_STRINGS records inside it and each string
; (at most STRING_MAX bytes) too, every piece's bytes inside the blob, max_piece_len == the
; longest piece's length (the prompt-length guard relies on it), every user id < vocab and its
; piece not empty; then the program (check_program). (From header_size on a failure is "bad
; header", file_size above the real size "truncated model": the order shows only in what each
; check may read.)
;   in: rbx path, rbp front_base   out: rbx = model_base (the header); out_buf holds the
;   file's struct stat (main.asm compares st_dev, st_ino with the --logits file's)
;   clobbers: rax rcx rdx rsi rdi r8-r15
load_model:
        push    rbx
        pop     rdi
        mov     esi, O_NONBLOCK
        call    sys_open
        js      err_cannot_read
        jnz     .fd
        dec     dword [rbp+V_STDIN]     ; descriptor 0: standard input was closed
.fd:
        mov     r8d, eax                ; fd
        xchg    edi, eax
        lea     rsi, [rbp+V_OUT_BUF]    ; kept there for the --logits check (main.asm)
        call    sys_fstat               ; (if it fails, the zeroed mode is no regular file)
        mov     al, [rsi+ST_MODE+1]     ; S_IFMT is in the mode's second byte
        shr     al, 4                   ; S_IFMT
        cmp     al, S_IFREG shr 12
        jne     err_cannot_read         ; directory, FIFO, device
        mov     rax, [rsi+ST_SIZE]
        cmp     rax, HEADER_SIZE
        jb      err_truncated
        xchg    rsi, rax
        push    1                       ; PROT_READ
        pop     rdx
        push    2                       ; MAP_PRIVATE
        pop     rcx
        call    sys_mmap_0              ; addr 0, offset 0
        js      err_cannot_read         ; -errno; addresses are below 2^47
        mov     [rbp+V_BASE], rax
        xchg    rbx, rax
        push    rbx
        pop     rdi
        push    MADV_HUGEPAGE
        pop     rdx
        mov     al, SYS_madvise
        call    sys_call                ; (result ignored: only speed depends on it)

        mov     rax, MODEL_MAGIC
        cmp     [rbx+HDR_MAGIC], rax
        jne     err_bad_magic
        cmp     dword [rbx+HDR_VERSION], MODEL_VERSION
        je      check_header
err_bad_version:
        call    fatal_here
        db      'not a version 4 model file: convert it again', 0
err_bad_magic:
        call    fatal_here
        db      'bad magic', 0
err_truncated:
        call    fatal_here
        db      'truncated model', 0
check_header:                           ; (load_model, after the magic and the version)
        cmp     dword [rbx+HDR_HEADER_SIZE], HEADER_SIZE
        jne     err_header
        cmp     [rbx+HDR_FILE_SIZE], rsi
        ja      err_truncated
        jne     err_header
        mov     r9d, [rbx+HDR_VOCAB]
        cmp     byte [rbx+HDR_VOCAB+3], 0       ; vocab below 2^24 (at least 256: byte_base
        jne     err_header              ; below; forward's 64 rows of logits: below 2^32 bytes)
        mov     eax, [rbx+HDR_MAX_CTX]
        dec     eax
        shr     eax, 16                 ; max_ctx 1 .. 2^16
        jnz     err_header
        mov     eax, [rbx+HDR_N_OPS]
        dec     eax
        shr     eax, 16                 ; n_ops 1 .. 2^16
        jnz     err_header
        mov     eax, [rbx+HDR_N_SLOTS]
        dec     eax
        cmp     eax, 254                ; n_slots 1 .. 255 (slot operands are bytes)
        ja      err_header
        mov     eax, [rbx+HDR_FLAGS]
        rol     eax, 32 - FLAG_MERGES_BIT       ; MERGES to bit 0, any other flag above it:
        cmp     eax, 1                  ; no flag but MERGES
        ja      err_header
        shl     eax, MAX_MERGES_BITS    ; MERGES: 2^24 merges at most, else none
        cmp     [rbx+HDR_N_MERGES], eax
        ja      err_header
        push    3                       ; bos, eos, eot < vocab
        pop     rcx
.special:
        cmp     [rbx+HDR_BOS-4+rcx*4], r9d
        jae     err_header
        loop    .special
        mov     eax, r9d                ; byte_base + 256 <= vocab:
        sub     eax, [rbx+HDR_BYTE_BASE]
        jb      err_header
        shr     eax, 8                  ; vocab - byte_base >= 256
        jnz     check_tables

err_header:
        call    fatal_here
        db      'bad header', 0

; check_tables: load_model's second half: the sections, the tokenizer tables, the program.
;   in: rbx header, r9d vocab
check_tables:
        mov     r8d, [rbx+HDR_HEADER_SIZE]      ; = HEADER_SIZE: the end of the previous section
        lea     rsi, [rbx+HDR_SLOTS_OFF]
        push    qword [rsi+HDR_WEIGHTS_SIZE-HDR_SLOTS_OFF]      ; the sections' sizes, the
        push    qword [rsi+HDR_BLOB_SIZE-HDR_SLOTS_OFF]         ; last first
        imul    eax, [rbx+HDR_N_MERGES], MERGE_REC      ; (n_merges <= 2^24: no overflow)
        push    rax
        mov     eax, [rbx+HDR_N_USER]
        shl     rax, 2
        push    rax
        mov     eax, [rbx+HDR_N_INDEX]
        shl     rax, 2
        push    rax
        imul    eax, r9d, PIECE_REC     ; vocab records (vocab < 2^24: no overflow)
        push    rax
        push    qword [rsi+HDR_STRINGS_SIZE-HDR_SLOTS_OFF]
        imul    eax, [rbx+HDR_N_OPS], OP_REC
        push    rax
        imul    eax, [rbx+HDR_N_SLOTS], SLOT_REC
        push    rax
        lea     rdi, [rbp+V_SLOTS]
        push    9
        pop     rcx
.section:                               ; slots .. weights: offsets and pointers in the same
        cmp     cl, 1                   ; order in the header and in vars.asm; each section
        jne     .after                  ; starts where the one before ends, the weights at
        dec     r8                      ; the blob's end rounded up to WEIGHTS_ALIGN
        or      r8w, WEIGHTS_ALIGN - 1
        inc     r8
        jz      err_header              ; (past 2^64)
.after:
        lodsq
        pop     rdx
        cmp     rax, r8
        jne     err_header
        add     r8, rdx
        jc      err_header
        add     rax, rbx
        stosq
        loop    .section                ; (rsi -> strings_size: the sizes follow)
        cmp     r8, [rsi+HDR_FILE_SIZE-HDR_STRINGS_SIZE]
        jne     err_header

        mov     rsi, [rbp+V_INDEX]
        mov     edx, [rbx+HDR_N_INDEX]
        xor     r10d, r10d              ; index pieces may be empty
        call    check_ids
        mov     rsi, [rbp+V_MERGES]
        mov     ecx, [rbx+HDR_N_MERGES]
        xor     r8d, r8d                ; the least (left, right) the next record may have
        jrcxz   .merged
.merge:
        mov     rax, [rsi]
        ror     rax, 32                 ; left * 2^32 + right
        cmp     rax, r8
        jb      check_ids.bad
        lea     r8, [rax+1]
        push    rcx
        push    3
        pop     rdx
        call    check_ids               ; left, right, result
        lodsd                           ; (score)
        pop     rcx
        loop    .merge
.merged:
        mov     rsi, [rbp+V_STRINGS]    ; the strings: each at most STRING_MAX bytes and
        push    N_STRINGS               ; inside the section (off + len <= its size), then
        pop     rcx                     ; the records inside it too (read first: still
.string:                                ; inside the mapping, which goes on to a page past
        lodsd                           ; off       weights_off)
        xchg    eax, edi
        lodsd                           ; len
        cmp     eax, STRING_MAX
        ja      check_ids.bad
        add     rdi, rax                ; (no carry: two u32)
        cmp     rdi, [rbx+HDR_STRINGS_SIZE]
        ja      check_ids.bad
        loop    .string
        cmp     rsi, [rbp+V_PIECES]     ; (the section ends where the pieces start)
        ja      check_ids.bad
        mov     rsi, [rbp+V_PIECES]
        mov     ecx, r9d
        xor     edi, edi                ; the longest piece so far
.piece:
        lodsd                           ; blob_off
        xchg    eax, edx
        lodsd                           ; len
        cmp     edi, eax
        cmovb   edi, eax
        add     rax, rdx
        cmp     rax, [rbx+HDR_BLOB_SIZE]
        ja      check_ids.bad
        lodsq                           ; (score, type)
        loop    .piece
        cmp     edi, [rbx+HDR_MAX_PIECE_LEN]
        jne     check_ids.bad
        mov     rsi, [rbp+V_USER]
        mov     edx, [rbx+HDR_N_USER]
        inc     r10d                    ; user pieces are matched: never empty
; check_ids: edx u32 ids at rsi must be < vocab (r9d), their pieces >= r10d bytes long.
;   in: rsi, edx, r9d, r10d   out: -   clobbers: rax rcx rdx rsi rdi r11
check_ids:
        sub     edx, 1
        jb      .ret
        lodsd
        cmp     eax, r9d
        jae     .bad
        call    piece
        cmp     ecx, r10d
        jae     check_ids
.bad:
        jmp     err_header
.ret:
        ret

; piece: where a piece's record and bytes are.
;   in: eax id (< vocab)   out: r11 -> its record, rdi -> its bytes, ecx = its length
;   clobbers: -
piece:
        imul    r11d, eax, PIECE_REC    ; < 2^28 (vocab < 2^24)
        add     r11, [rbp+V_PIECES]
        mov     edi, [r11+PIECE_BLOB_OFF]
        add     rdi, [rbp+V_BLOB]
        mov     ecx, [r11+PIECE_LEN]
        ret
