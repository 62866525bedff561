// HistoryOptions: their checks, their names in text (parse and to_string),
// and the recorder's copy of them.
#include "history_options.hpp"

#include <string>

#include "cachealloc/errors.hpp"
#include "history_state.hpp"

namespace cachealloc {

void detail::validate(const HistoryOptions& options) {
  if (options.max_entries == 0) throw InvalidArgument("record_history: max_entries must be at least 1");
  if (options.max_frames == 0 || options.max_frames > detail::kMaxStackFrames)
    throw InvalidArgument("record_history: max_frames must be within [1, " +
                          std::to_string(detail::kMaxStackFrames) + "], not " + std::to_string(options.max_frames));
  if (!options.stream.empty() && options.stream_buffer_bytes < (std::size_t{16} << 20))
    throw InvalidArgument("record_history: stream_buffer_bytes must be at least 16 MiB, not " +
                          std::to_string(options.stream_buffer_bytes));
}

StackCapture parse_stack_capture(std::string_view text) {
  if (text == "none") return StackCapture::none;
  if (text == "native") return StackCapture::native;
  if (text == "unwind") return StackCapture::unwind;
  if (text == "python") return StackCapture::python;
  if (text == "native+python") return StackCapture::native_python;
  if (text == "unwind+python") return StackCapture::unwind_python;
  throw InvalidArgument("unknown stack capture '" + std::string(text) +
                        "' (expected none, native, unwind, python, native+python or unwind+python)");
}

StackCapture with_interpreter_frames(StackCapture capture) noexcept {
  switch (capture) {
    case StackCapture::none: return StackCapture::python;
    case StackCapture::native: return StackCapture::native_python;
    case StackCapture::unwind: return StackCapture::unwind_python;
    default: return capture;
  }
}

HistoryClock parse_history_clock(std::string_view text) {
  if (text == "precise") return HistoryClock::precise;
  if (text == "coarse") return HistoryClock::coarse;
  throw InvalidArgument("unknown history clock '" + std::string(text) + "' (expected precise or coarse)");
}

const char* to_string(HistoryClock clock) noexcept { return clock == HistoryClock::coarse ? "coarse" : "precise"; }

const char* to_string(StackCapture capture) noexcept {
  switch (capture) {
    case StackCapture::native: return "native";
    case StackCapture::unwind: return "unwind";
    case StackCapture::python: return "python";
    case StackCapture::native_python: return "native+python";
    case StackCapture::unwind_python: return "unwind+python";
    case StackCapture::none: break;
  }
  return "none";
}

HistoryOptions HistoryRecorder::options() const {
  std::lock_guard lock(state_->control);
  return state_->options;
}

}  // namespace cachealloc
