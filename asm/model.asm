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

; load_model: map the file named by -m (asking for huge pages) and validate it; sets
; model_base, model_size and pieces_ptr, index_ptr, user_ptr, blob_ptr.
; Checks, in order: size >= the header (else truncated), magic, version, header_size,
; file_size == the real size (larger: truncated), dims nonzero and bounded (dim_bits:
; every product the engine forms fits in 64 bits) and eps, att_scale, embed_scale finite and
; > 0 (one loop, the last field first), flags known (FLAG_*), the soft-caps 0 or finite and
; > 0, heads % kv_heads == 0, head_dim even, ffn a multiple of 4, bos/eos/eot < vocab,
; byte_base + 256 <= vocab, sections in order and non-overlapping (pieces, index, user, blob,
; weights) ending at file_size, weights_off % 4096 == 0, every piece's bytes inside the blob,
; max_piece_len == the longest piece's length (the prompt-length guard relies on it), every
; index and user id < vocab, user pieces not empty.
;   in: rbx path, rbp front_base   out: rbx = model_base (the header); out_buf holds the
;   file's struct stat (main.asm compares st_dev, st_ino with the --logits file's)
;   clobbers: rax rcx rdx rsi rdi r8-r11
load_model:
        push    rbx
        pop     rdi
        mov     esi, O_NONBLOCK
        call    sys_open
        js      err_cannot_read
        mov     r8d, eax                ; fd
        xchg    edi, eax
        lea     rsi, [rbp+V_OUT_BUF]    ; kept there for the --logits check (main.asm)
        call    sys_fstat               ; (if it fails, the zeroed mode is no regular file)
        mov     al, [rsi+ST_MODE+1]     ; S_IFMT is in the mode's second byte
        and     al, S_IFMT shr 8
        cmp     al, S_IFREG shr 8
        jne     err_cannot_read         ; directory, FIFO, device
        mov     rax, [rsi+ST_SIZE]
        cmp     rax, HEADER_SIZE
        jb      err_truncated
        mov     [rbp+V_SIZE], rax
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
        db      'bad version', 0
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

        push    10                      ; the 11 fields vocab .. embed_scale, last first:
        pop     rdx                     ; 0 < bits <= FLT_MAX, and for vocab .. max_ctx
.field:                                 ; 1 <= field <= 2^dim_bits (the floats shift by 31)
        mov     eax, [rbx+HDR_VOCAB+rdx*4]
        dec     eax
        cmp     eax, 0x7F7FFFFF
        jae     err_header
        mov     cl, [dim_bits+rdx]
        shr     eax, cl
        jnz     err_header
        dec     edx
        jns     .field
        cmp     dword [rbx+HDR_FLAGS], FLAG_POST_NORMS or FLAG_QK_NORM or FLAG_Q8_0
        ja      err_header
        mov     eax, 0x7F7FFFFF         ; FLT_MAX's bits: a soft-cap's bits must not exceed
        cmp     [rbx+HDR_ATT_SOFTCAP], eax      ; them (0: none; no sign, inf or NaN)
        ja      err_header
        cmp     [rbx+HDR_FINAL_SOFTCAP], eax
        ja      err_header
        mov     eax, [rbx+HDR_HEADS]
        xor     edx, edx
        div     dword [rbx+HDR_KV_HEADS]
        test    edx, edx
        jnz     err_header
        test    byte [rbx+HDR_HEAD_DIM], 1
        jnz     err_header
        test    byte [rbx+HDR_FFN], 3   ; (geglu takes four values a pass)
        jnz     err_header
        mov     r9d, [rbx+HDR_VOCAB]
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

; check_tables: load_model's second half: the sections and the tokenizer tables.
;   in: rbx header, r9d vocab
check_tables:
        mov     r8d, [rbx+HDR_HEADER_SIZE]      ; = HEADER_SIZE: the end of the previous section
        push    qword [rbx+HDR_BLOB_SIZE]
        mov     eax, [rbx+HDR_N_USER]
        shl     rax, 2
        push    rax
        mov     eax, [rbx+HDR_N_INDEX]
        shl     rax, 2
        push    rax
        imul    eax, r9d, PIECE_REC     ; vocab records (vocab <= 2^24: no overflow)
        push    rax
        lea     rsi, [rbx+HDR_PIECES_OFF]
        lea     rdi, [rbp+V_PIECES]
        push    4
        pop     rcx
.section:                               ; pieces, index, user, blob: offsets and pointers in
        lodsq                           ; the same order in the header and in vars.asm
        pop     rdx
        call    check_section
        stosq
        loop    .section
        lodsq                           ; (blob_size)
        lodsq                           ; weights_off
        test    ax, WEIGHTS_ALIGN - 1
        jnz     err_header
        mov     rdx, [rsi]              ; weights_size
        call    check_section
        cmp     r8, [rsi+HDR_FILE_SIZE-HDR_WEIGHTS_SIZE]
        jne     err_header

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
        ja      err_header
        lodsq                           ; (score, type)
        loop    .piece
        cmp     edi, [rbx+HDR_MAX_PIECE_LEN]
        jne     err_header
        mov     rsi, [rbp+V_INDEX]
        mov     edx, [rbx+HDR_N_INDEX]
        xor     r10d, r10d              ; index pieces may be empty
        call    check_ids
        mov     rsi, [rbp+V_USER]
        mov     edx, [rbx+HDR_N_USER]
        inc     r10d                    ; user pieces are matched: never empty
; check_ids: edx u32 ids at rsi must be < vocab (r9d), their pieces >= r10d bytes long.
;   in: rsi, edx, r9d, r10d   out: -   clobbers: rax rcx rdx rsi rdi r11
check_ids:
        sub     edx, 1
        jb      check_section.ret
        lodsd
        cmp     eax, r9d
        jae     .bad
        call    piece
        cmp     ecx, r10d
        jae     check_ids
.bad:
        jmp     err_header

; check_section: check one section against the end of the previous one.
;   in: rax offset, rdx size, r8 previous end, rbx header   out: r8 = this end,
;   rax = rbx + offset   clobbers: -
check_section:
        cmp     rax, r8
        jb      check_ids.bad
        mov     r8, rax
        add     r8, rdx
        jc      check_ids.bad
        add     rax, rbx
.ret:
        ret

; piece: where a piece's record and bytes are.
;   in: eax id (< vocab)   out: r11 -> its record, rdi -> its bytes, ecx = its length
;   clobbers: -
piece:
        imul    r11d, eax, PIECE_REC    ; < 2^28 (vocab <= 2^24)
        add     r11, [rbp+V_PIECES]
        mov     edi, [r11+PIECE_BLOB_OFF]
        add     rdi, [rbp+V_BLOB]
        mov     ecx, [r11+PIECE_LEN]
        ret

; dim_bits: vocab .. max_ctx may be at most 2^bits. These bounds keep every size the engine
; computes (weights, KV cache, scratch) far below 2^64. (31 for eps, att_scale, embed_scale:
; no bound beyond FLT_MAX.)
dim_bits:
        db      24, 16, 16, 10, 10, 10, 16, 16  ; vocab dim ffn layers heads kv_heads head_dim max_ctx
        db      31, 31, 31                      ; eps att_scale embed_scale
