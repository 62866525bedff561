// The pickle opcodes of protocols 0 to 5 by byte: their names, and which
// would import or call code. Private to the snapshot library.
#pragma once

#include <cstdint>

namespace cachealloc::snapshot::pickle {

struct OpcodeInfo {
  const char* name;  // nullptr: no opcode of protocols 0 to 5
  bool executes;     // imports or calls something: never allowed
};

// Every opcode of protocols 0 to 5, so each rejection can name its opcode.
OpcodeInfo describe_opcode(std::uint8_t op) noexcept;

}  // namespace cachealloc::snapshot::pickle
