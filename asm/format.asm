; format.asm: the model file's layout, mirrored from builder/models/modelfile.py
; (HEADER_FIELDS); emu_tests/models/test_format_mirror.py checks every constant here against it.

MODEL_MAGIC     = 0x4D5341414D4D4547        ; "GEMMAASM" read as a little-endian qword
MODEL_VERSION   = 2
HEADER_SIZE     = 256
PIECE_REC       = 16            ; per piece: u32 blob_off, u32 len, f32 score, u32 type
TENSOR_ALIGN    = 64            ; every tensor offset (relative to weights_off)
WEIGHTS_ALIGN   = 4096          ; weights_off

; header fields: byte offsets (u32 unless noted)
HDR_MAGIC       = 0             ; 8 bytes
HDR_VERSION     = 8
HDR_HEADER_SIZE = 12
HDR_VOCAB       = 16
HDR_DIM         = 20
HDR_FFN         = 24
HDR_LAYERS      = 28
HDR_HEADS       = 32
HDR_KV_HEADS    = 36
HDR_HEAD_DIM    = 40
HDR_MAX_CTX     = 44
HDR_EPS         = 48            ; f32
HDR_ATT_SCALE   = 52            ; f32: multiplies q.k
HDR_EMBED_SCALE = 56            ; f32
HDR_BOS         = 60
HDR_EOS         = 64
HDR_EOT         = 68
HDR_BYTE_BASE   = 72            ; id of <0x00>; <0x00>..<0xFF> are contiguous
HDR_N_INDEX     = 76
HDR_N_USER      = 80
HDR_MAX_PIECE_LEN = 84
HDR_PIECES_OFF  = 88            ; u64 offsets and sizes from here on
HDR_INDEX_OFF   = 96
HDR_USER_OFF    = 104
HDR_BLOB_OFF    = 112
HDR_BLOB_SIZE   = 120
HDR_WEIGHTS_OFF = 128
HDR_WEIGHTS_SIZE = 136
HDR_FILE_SIZE   = 144
HDR_FLAGS       = 152           ; u32: FLAG_* below
HDR_ATT_SOFTCAP = 156           ; f32: 0 = none, else c: scores s -> c tanh(s / c)
HDR_FINAL_SOFTCAP = 160         ; f32: the same on the logits

; header flags: the optional norms every layer has, and the matrices' type
FLAG_POST_NORMS = 1             ; post_attn_norm, post_ffn_norm (ffn_norm is then the pre-norm)
FLAG_QK_NORM    = 2             ; q_norm, k_norm (head_dim each), on every head before rope
FLAG_Q8_0       = 4             ; a matrix with rows of a multiple of QK8_0 weights: Q8_0 blocks
QK8_0           = 32            ; weights per Q8_0 block: an FP16 scale d, QK8_0 int8 q
Q8_0_BLOCK      = 2 + QK8_0     ; its bytes

; piece record fields
PIECE_BLOB_OFF  = 0
PIECE_LEN       = 4
PIECE_SCORE     = 8
PIECE_TYPE      = 12

; sentencepiece piece types
PIECE_NORMAL    = 1
PIECE_UNKNOWN   = 2
PIECE_CONTROL   = 3
PIECE_USER      = 4
PIECE_UNUSED    = 5
PIECE_BYTE      = 6
