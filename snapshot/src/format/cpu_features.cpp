// CPU feature detection: which instructions this CPU runs fast.
#include "cpu_features.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace cachealloc::snapshot::detail {

bool pext_is_fast() noexcept {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  if ((ebx & (1u << 8)) == 0) return false;  // BMI2
  __cpuid(0, eax, ebx, ecx, edx);
  const bool intel = ebx == 0x756e6547 && edx == 0x49656e69 && ecx == 0x6c65746e;  // "GenuineIntel"
  if (intel) return true;
  __cpuid(1, eax, ebx, ecx, edx);
  unsigned family = (eax >> 8) & 0xf;
  if (family == 0xf) family += (eax >> 20) & 0xff;
  return family >= 0x19;
#else
  return false;
#endif
}

}  // namespace cachealloc::snapshot::detail
