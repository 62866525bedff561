// The names of the pickle opcodes (Python's Lib/pickle.py), for messages.
#include "pickle_opcodes.hpp"

namespace cachealloc::snapshot::pickle {

OpcodeInfo describe_opcode(std::uint8_t op) noexcept {
  switch (op) {
    case 0x28: return {"MARK", false};
    case 0x2e: return {"STOP", false};
    case 0x30: return {"POP", false};
    case 0x31: return {"POP_MARK", false};
    case 0x32: return {"DUP", false};
    case 0x46: return {"FLOAT", false};
    case 0x49: return {"INT", false};
    case 0x4a: return {"BININT", false};
    case 0x4b: return {"BININT1", false};
    case 0x4c: return {"LONG", false};
    case 0x4d: return {"BININT2", false};
    case 0x4e: return {"NONE", false};
    case 0x50: return {"PERSID", true};
    case 0x51: return {"BINPERSID", true};
    case 0x52: return {"REDUCE", true};
    case 0x53: return {"STRING", false};
    case 0x54: return {"BINSTRING", false};
    case 0x55: return {"SHORT_BINSTRING", false};
    case 0x56: return {"UNICODE", false};
    case 0x58: return {"BINUNICODE", false};
    case 0x61: return {"APPEND", false};
    case 0x62: return {"BUILD", true};
    case 0x63: return {"GLOBAL", true};
    case 0x64: return {"DICT", false};
    case 0x7d: return {"EMPTY_DICT", false};
    case 0x65: return {"APPENDS", false};
    case 0x67: return {"GET", false};
    case 0x68: return {"BINGET", false};
    case 0x69: return {"INST", true};
    case 0x6a: return {"LONG_BINGET", false};
    case 0x6c: return {"LIST", false};
    case 0x5d: return {"EMPTY_LIST", false};
    case 0x6f: return {"OBJ", true};
    case 0x70: return {"PUT", false};
    case 0x71: return {"BINPUT", false};
    case 0x72: return {"LONG_BINPUT", false};
    case 0x73: return {"SETITEM", false};
    case 0x74: return {"TUPLE", false};
    case 0x29: return {"EMPTY_TUPLE", false};
    case 0x75: return {"SETITEMS", false};
    case 0x47: return {"BINFLOAT", false};
    case 0x80: return {"PROTO", false};
    case 0x81: return {"NEWOBJ", true};
    case 0x82: return {"EXT1", true};
    case 0x83: return {"EXT2", true};
    case 0x84: return {"EXT4", true};
    case 0x85: return {"TUPLE1", false};
    case 0x86: return {"TUPLE2", false};
    case 0x87: return {"TUPLE3", false};
    case 0x88: return {"NEWTRUE", false};
    case 0x89: return {"NEWFALSE", false};
    case 0x8a: return {"LONG1", false};
    case 0x8b: return {"LONG4", false};
    case 0x42: return {"BINBYTES", false};
    case 0x43: return {"SHORT_BINBYTES", false};
    case 0x8c: return {"SHORT_BINUNICODE", false};
    case 0x8d: return {"BINUNICODE8", false};
    case 0x8e: return {"BINBYTES8", false};
    case 0x8f: return {"EMPTY_SET", false};
    case 0x90: return {"ADDITEMS", false};
    case 0x91: return {"FROZENSET", false};
    case 0x92: return {"NEWOBJ_EX", true};
    case 0x93: return {"STACK_GLOBAL", true};
    case 0x94: return {"MEMOIZE", false};
    case 0x95: return {"FRAME", false};
    case 0x96: return {"BYTEARRAY8", false};
    case 0x97: return {"NEXT_BUFFER", false};
    case 0x98: return {"READONLY_BUFFER", false};
    default: return {nullptr, false};
  }
}

}  // namespace cachealloc::snapshot::pickle
