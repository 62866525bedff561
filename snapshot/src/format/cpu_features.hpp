// What this CPU runs fast, asked of CPUID. Private to the snapshot library.
#pragma once

namespace cachealloc::snapshot::detail {

// Whether this CPU's PEXT is fast: BMI2 on Intel, or on AMD from family 0x19
// (Zen 3); Zen 1 and 2 (family 0x17) run it in microcode, hundreds of cycles.
// False on any other architecture. The event decoder picks its varint merge
// by it (varint_pext(), format.hpp).
bool pext_is_fast() noexcept;

}  // namespace cachealloc::snapshot::detail
