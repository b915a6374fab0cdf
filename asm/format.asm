; format.asm: the model file's layout (version 4), mirrored from builder/models/modelfile4.py;
; emu_tests/models/test_format_mirror.py checks every constant here against it.

MODEL_MAGIC     = 0x4D5341414D4D4547        ; "GEMMAASM" read as a little-endian qword
MODEL_VERSION   = 4
HEADER_SIZE     = 256
PIECE_REC       = 16            ; per piece: u32 blob_off, u32 len, f32 score, u32 type
SLOT_REC        = 8             ; per slot: u32 width, u32 flags
OP_REC          = 48            ; per op: the fields OP_* below
TENSOR_ALIGN    = 64            ; every weight offset (relative to weights_off)
WEIGHTS_ALIGN   = 4096          ; weights_off

; header fields: byte offsets (u32 unless noted)
HDR_MAGIC       = 0             ; 8 bytes
HDR_VERSION     = 8
HDR_HEADER_SIZE = 12
HDR_VOCAB       = 16
HDR_MAX_CTX     = 20
HDR_FLAGS       = 24            ; FLAG_* below
HDR_BOS         = 28
HDR_EOS         = 32
HDR_EOT         = 36
HDR_BYTE_BASE   = 40            ; id of <0x00>; <0x00>..<0xFF> are contiguous
HDR_N_INDEX     = 44
HDR_N_USER      = 48
HDR_N_MERGES    = 52
HDR_MAX_PIECE_LEN = 56
HDR_N_SLOTS     = 60
HDR_N_OPS       = 64
HDR_GENERATION  = 68            ; informational: the engine never reads it
HDR_SLOTS_OFF   = 72            ; u64: the sections' offsets in file order, then sizes
HDR_PROGRAM_OFF = 80
HDR_STRINGS_OFF = 88
HDR_PIECES_OFF  = 96
HDR_INDEX_OFF   = 104
HDR_USER_OFF    = 112
HDR_MERGES_OFF  = 120
HDR_BLOB_OFF    = 128
HDR_WEIGHTS_OFF = 136
HDR_STRINGS_SIZE = 144
HDR_BLOB_SIZE   = 152
HDR_WEIGHTS_SIZE = 160
HDR_FILE_SIZE   = 168

FLAG_MERGES_BIT = 3
FLAG_MERGES     = 1 shl FLAG_MERGES_BIT ; the tokenizer merges by rank (merge records)
MAX_MERGES_BITS = 24            ; at most 2^24 merge records
MERGE_SHIFT     = 4
MERGE_REC       = 1 shl MERGE_SHIFT     ; per merge: u32 left, u32 right, u32 result, f32 score
MERGE_LEFT      = 0             ; the pair's left id
MERGE_RIGHT     = 4             ; its right id
MERGE_RESULT    = 8             ; the id the pair (left, right) merges into
MERGE_SCORE     = 12            ; -rank: the lower rank merges first

; slot record fields and flags
SLOT_WIDTH      = 0             ; floats a token's row holds at most (1 .. MAX_WIDTH)
SLOT_FLAGS      = 4
SLOT_CACHE      = 1             ; ctx rows, indexed by position (a K or V cache), not BLOCK
MAX_WIDTH       = 65536

; op record fields
OP_OP           = 0             ; opcode (OPC_*)
OP_S0           = 4             ; u8 slot operands 0 .. 3 (slots count from 1; 0: none)
OP_N            = 8
OP_M            = 12
OP_K            = 16
OP_J            = 20
OP_A            = 24            ; f32
OP_C            = 28            ; f32
OP_W            = 32            ; u64: weight offset from weights_off
OP_WTYPE        = 40            ; WT_*
OP_FLAGS        = 44            ; OPF_*
OPF_ACC         = 1             ; the destination is added to

; opcodes
OPC_EMBED       = 1
OPC_NORM        = 2
OPC_MATMUL      = 3
OPC_ROPE        = 4
OPC_ATTN        = 5
OPC_GEGLU       = 6
OPC_SCALE       = 7
OPC_ADD         = 8
OPC_LOGITS      = 9
N_OPCODES       = 9

; weight types
WT_F32          = 0
WT_F16          = 1
WT_Q8_0         = 2
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

; the strings section (the chat turn template): N_STRINGS records (u32 offset from the
; section's start, u32 length), in this order; each string at most STRING_MAX bytes
STRING_REC      = 8
N_STRINGS       = 5
STRING_MAX      = 256
S_SYS_BEGIN     = 0 * STRING_REC        ; opens the first turn when there is a system prompt
S_SYS_END       = 1 * STRING_REC        ; between the system text and the first user text
S_USER_BEGIN    = 2 * STRING_REC        ; opens a user turn otherwise
S_USER_END      = 3 * STRING_REC        ; closes a user turn and opens the reply
S_REPLY_END     = 4 * STRING_REC        ; after a reply
