// The text of a zstd-compressed file of testdata (the long runs' stats.json),
// for tests. Throws std::runtime_error when the file is missing or corrupt.
#pragma once

#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace cachealloc::testing {

inline std::string zstd_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  const std::string packed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ZSTD_DStream* stream = ZSTD_createDStream();
  std::string text;
  ZSTD_inBuffer input{packed.data(), packed.size(), 0};
  std::string chunk(ZSTD_DStreamOutSize(), '\0');
  std::size_t left = 1;
  while (input.pos < input.size) {
    ZSTD_outBuffer output{chunk.data(), chunk.size(), 0};
    left = ZSTD_decompressStream(stream, &output, &input);
    if (ZSTD_isError(left)) break;
    text.append(chunk.data(), output.pos);
  }
  ZSTD_freeDStream(stream);
  if (ZSTD_isError(left) || left != 0) throw std::runtime_error("corrupt zstd file " + path.string());
  return text;
}

}  // namespace cachealloc::testing
