// libFuzzer target: the PyTorch pickle reader on arbitrary bytes (PROTO 4 is
// put in front of an input that does not start like a pickle, so every input
// reaches the parser). A decoded snapshot must hold every rule our own
// format's reader holds a file to (validate()): convert writes it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> raw(reinterpret_cast<const std::byte*>(data), size);
  std::vector<std::byte> bytes;
  if (!cachealloc::snapshot::has_pickle_header(raw)) bytes = {std::byte{0x80}, std::byte{0x04}};
  bytes.insert(bytes.end(), raw.begin(), raw.end());
  cachealloc::snapshot::Snapshot snapshot;
  try {
    snapshot = cachealloc::snapshot::decode_pytorch_pickle(bytes);
  } catch (const cachealloc::snapshot::SnapshotError& error) {
    cachealloc::fuzz::check_message(error.what());
    return 0;
  }
  try {
    cachealloc::snapshot::validate(snapshot);
  } catch (const cachealloc::snapshot::SnapshotError&) {
    std::abort();  // the pickle reader let through what our reader refuses
  }
  return 0;
}
