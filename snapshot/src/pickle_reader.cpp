// The restricted unpickler: a stack machine over the opcodes that build plain
// data. See pickle.hpp for what it accepts and what it costs.
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>

#include "cachealloc/snapshot/format.hpp"
#include "pickle_value.hpp"

namespace cachealloc::snapshot::pickle {

namespace {

// Values waiting on the stack. PyTorch's pickles never hold more than a few
// thousand (the pickler batches APPENDS/SETITEMS by 1000 and the schema is
// about 7 levels deep); the cap turns a file of 100k nested lists into an
// error instead of a large stack.
constexpr std::size_t kMaxStack = 1u << 16;
// Open MARKs: nesting of (  ... LIST/DICT/TUPLE/APPENDS/SETITEMS.
constexpr std::size_t kMaxMarks = 1000;

// Nodes every pickle shares: immutable values that need no node of their own.
constexpr NodeId kNoneNode = 0;
constexpr NodeId kTrueNode = 1;
constexpr NodeId kFalseNode = 2;
constexpr NodeId kEmptyTupleNode = 3;

struct OpcodeInfo {
  const char* name;
  bool executes;  // imports or calls something: never allowed
};

// Every opcode of protocols 0 to 5, so each rejection can name its opcode.
OpcodeInfo describe(std::uint8_t op) noexcept {
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

std::string hex_byte(std::uint8_t value) {
  std::array<char, 8> text{};
  std::snprintf(text.data(), text.size(), "0x%02x", static_cast<unsigned>(value));
  return text.data();
}

class Unpickler {
 public:
  explicit Unpickler(std::span<const std::byte> bytes) : bytes_(bytes) {
    tree_.nodes.resize(4);
    tree_.nodes[kNoneNode].kind = Kind::none;
    tree_.nodes[kTrueNode].kind = Kind::boolean;
    tree_.nodes[kTrueNode].flag = true;
    tree_.nodes[kFalseNode].kind = Kind::boolean;
    tree_.nodes[kEmptyTupleNode].kind = Kind::tuple;
  }

  Tree run() {
    if (bytes_.empty()) throw SnapshotError(ErrorCode::truncated, "truncated pickle: the input is empty");
    if (std::to_integer<std::uint8_t>(bytes_[0]) != 0x80 || bytes_.size() < 2) {
      if (bytes_.size() < 2 && std::to_integer<std::uint8_t>(bytes_[0]) == 0x80) {
        throw SnapshotError(ErrorCode::truncated, "truncated pickle: it ends inside the PROTO opcode");
      }
      throw SnapshotError(ErrorCode::not_a_snapshot,
                          "not a PyTorch memory snapshot: no pickle PROTO opcode (protocol 2 or later) at offset 0");
    }
    const auto protocol = std::to_integer<unsigned>(bytes_[1]);
    if (protocol > 5) {
      throw SnapshotError(ErrorCode::newer_version, "pickle protocol " + std::to_string(protocol) +
                                                        " is newer than the newest this reader knows (5)");
    }
    if (protocol < 2) {
      throw SnapshotError(ErrorCode::unsupported,
                          "pickle protocol " + std::to_string(protocol) + " is not supported (2 to 5 are)");
    }
    position_ = 2;
    while (!step()) {
    }
    return std::move(tree_);
  }

 private:
  // Returns true at STOP.
  bool step() {
    op_offset_ = position_;
    op_ = read_u8();
    switch (op_) {
      case 0x80: {  // PROTO inside the stream: allowed, must agree on the range
        const unsigned protocol = read_u8();
        if (protocol > 5) {
          throw SnapshotError(ErrorCode::newer_version, "pickle protocol " + std::to_string(protocol) +
                                                            " is newer than the newest this reader knows (5)");
        }
        return false;
      }
      case 0x95: {  // FRAME: a hint for buffered readers; the whole input is in memory
        const std::uint64_t length = read_le(8);
        if (length > remaining()) truncated_length(length);
        return false;
      }
      case 0x2e: {  // STOP
        root_of_stack();
        return true;
      }
      case 0x28:  // MARK
        if (marks_.size() >= kMaxMarks) {
          inconsistent("nesting deeper than " + std::to_string(kMaxMarks) + " MARKs");
        }
        marks_.push_back(stack_.size());
        return false;
      case 0x94:  // MEMOIZE
        memo_put(static_cast<std::uint32_t>(memo_.size()));
        return false;
      case 0x71: memo_put(read_u8()); return false;                                       // BINPUT
      case 0x72: memo_put(static_cast<std::uint32_t>(read_le(4))); return false;          // LONG_BINPUT
      case 0x68: memo_get(read_u8()); return false;                                       // BINGET
      case 0x6a: memo_get(static_cast<std::uint32_t>(read_le(4))); return false;          // LONG_BINGET
      case 0x7d: push(make(Kind::dict)); return false;                                    // EMPTY_DICT
      case 0x5d: push(make(Kind::list)); return false;                                    // EMPTY_LIST
      case 0x29: push(kEmptyTupleNode); return false;                                     // EMPTY_TUPLE
      case 0x64: collect(Kind::dict); return false;                                       // DICT
      case 0x6c: collect(Kind::list); return false;                                       // LIST
      case 0x74: collect(Kind::tuple); return false;                                      // TUPLE
      case 0x85: small_tuple(1); return false;                                            // TUPLE1
      case 0x86: small_tuple(2); return false;                                            // TUPLE2
      case 0x87: small_tuple(3); return false;                                            // TUPLE3
      case 0x61: append(); return false;                                                  // APPEND
      case 0x65: extend(Kind::list); return false;                                        // APPENDS
      case 0x73: set_item(); return false;                                                // SETITEM
      case 0x75: extend(Kind::dict); return false;                                        // SETITEMS
      case 0x4e: push(kNoneNode); return false;                                           // NONE
      case 0x88: push(kTrueNode); return false;                                           // NEWTRUE
      case 0x89: push(kFalseNode); return false;                                          // NEWFALSE
      case 0x4a: {                                                                        // BININT
        const auto value = static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4)));
        push_integer(value < 0, value < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(static_cast<std::int64_t>(value))
                                          : static_cast<std::uint64_t>(value));
        return false;
      }
      case 0x4b: push_integer(false, read_u8()); return false;                            // BININT1
      case 0x4d: push_integer(false, read_le(2)); return false;                           // BININT2
      case 0x8a: long_integer(read_u8()); return false;                                   // LONG1
      case 0x8b: {                                                                        // LONG4
        const auto length = static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4)));
        if (length < 0) inconsistent("LONG4 declares a negative length");
        long_integer(static_cast<std::uint64_t>(length));
        return false;
      }
      case 0x47: {  // BINFLOAT: big-endian IEEE 754
        const std::span<const std::byte> raw = take(8);
        std::uint64_t bits = 0;
        for (const std::byte b : raw) bits = (bits << 8) | std::to_integer<std::uint64_t>(b);
        double value = 0;
        std::memcpy(&value, &bits, sizeof value);
        const NodeId id = make(Kind::floating);
        tree_.nodes[id].number = value;
        push(id);
        return false;
      }
      case 0x8c: push_text(Kind::text, read_u8()); return false;     // SHORT_BINUNICODE
      case 0x58: push_text(Kind::text, read_le(4)); return false;    // BINUNICODE
      case 0x8d: push_text(Kind::text, read_le(8)); return false;    // BINUNICODE8
      case 0x43: push_text(Kind::bytes, read_u8()); return false;    // SHORT_BINBYTES
      case 0x42: push_text(Kind::bytes, read_le(4)); return false;   // BINBYTES
      case 0x8e: push_text(Kind::bytes, read_le(8)); return false;   // BINBYTES8
      default: reject();
    }
  }

  [[noreturn]] void reject() const {
    const OpcodeInfo info = describe(op_);
    const std::string where = " at offset " + std::to_string(op_offset_);
    if (info.name == nullptr) {
      throw SnapshotError(ErrorCode::unsupported, "unknown pickle opcode " + hex_byte(op_) + where);
    }
    if (info.executes) {
      throw SnapshotError(ErrorCode::unsupported,
                          std::string("pickle opcode ") + info.name + " (" + hex_byte(op_) + ")" + where +
                              " would import or call code; a memory snapshot is plain data and this reader "
                              "never executes anything from the file");
    }
    throw SnapshotError(ErrorCode::unsupported, std::string("pickle opcode ") + info.name + " (" + hex_byte(op_) +
                                                    ")" + where + " is not supported by this reader");
  }

  [[noreturn]] void inconsistent(const std::string& what) const {
    const OpcodeInfo info = describe(op_);
    throw SnapshotError(ErrorCode::inconsistent, "bad pickle: " + what + " (" +
                                                     (info.name != nullptr ? info.name : "opcode") + " at offset " +
                                                     std::to_string(op_offset_) + ")");
  }

  [[noreturn]] void truncated_length(std::uint64_t wanted) const {
    const OpcodeInfo info = describe(op_);
    throw SnapshotError(ErrorCode::truncated,
                        std::string("truncated pickle: ") + (info.name != nullptr ? info.name : "opcode") +
                            " at offset " + std::to_string(op_offset_) + " needs " + std::to_string(wanted) +
                            " bytes but only " + std::to_string(remaining()) + " remain");
  }

  std::size_t remaining() const noexcept { return bytes_.size() - position_; }

  std::span<const std::byte> take(std::uint64_t length) {
    if (length > remaining()) {
      if (position_ == op_offset_) {
        throw SnapshotError(ErrorCode::truncated, "truncated pickle: it ends at offset " +
                                                      std::to_string(position_) + " without a STOP opcode");
      }
      truncated_length(length);
    }
    const std::span<const std::byte> out = bytes_.subspan(position_, static_cast<std::size_t>(length));
    position_ += static_cast<std::size_t>(length);
    return out;
  }
  std::uint8_t read_u8() { return std::to_integer<std::uint8_t>(take(1)[0]); }
  std::uint64_t read_le(std::size_t width) {
    const std::span<const std::byte> raw = take(width);
    std::uint64_t value = 0;
    for (std::size_t i = width; i-- > 0;) value = (value << 8) | std::to_integer<std::uint64_t>(raw[i]);
    return value;
  }

  NodeId make(Kind kind) {
    tree_.nodes.emplace_back();
    tree_.nodes.back().kind = kind;
    return static_cast<NodeId>(tree_.nodes.size() - 1);
  }

  std::size_t floor() const noexcept { return marks_.empty() ? 0 : marks_.back(); }

  void push(NodeId id) {
    if (stack_.size() >= kMaxStack) {
      inconsistent("nesting too deep: more than " + std::to_string(kMaxStack) + " values on the stack");
    }
    stack_.push_back(id);
  }
  NodeId pop() {
    if (stack_.size() <= floor()) inconsistent("the stack is empty");
    const NodeId id = stack_.back();
    stack_.pop_back();
    return id;
  }
  NodeId top() {
    if (stack_.size() <= floor()) inconsistent("the stack is empty");
    return stack_.back();
  }
  std::size_t pop_mark() {
    if (marks_.empty()) inconsistent("no MARK to close");
    const std::size_t mark = marks_.back();
    marks_.pop_back();
    return mark;
  }

  void root_of_stack() {
    if (stack_.empty()) inconsistent("STOP with an empty stack");
    tree_.root = stack_.back();
  }

  void memo_put(std::uint32_t index) {
    // One memo entry per opcode at most, so the memo stays linear in the input.
    memo_[index] = top();
  }
  void memo_get(std::uint32_t index) {
    const auto found = memo_.find(index);
    if (found == memo_.end()) inconsistent("memo index " + std::to_string(index) + " was never stored");
    push(found->second);
  }

  Node& container(NodeId id, Kind expected) {
    Node& node = tree_.nodes[id];
    if (node.kind != expected) {
      inconsistent(std::string("expected a ") + to_string(expected) + " on the stack, found a " + to_string(node.kind));
    }
    return node;
  }

  void collect(Kind kind) {
    const std::size_t mark = pop_mark();
    if ((stack_.size() - mark) % 2 != 0 && kind == Kind::dict) inconsistent("DICT with an odd number of items");
    const NodeId id = make(kind);
    tree_.nodes[id].items.assign(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    push(id);
  }

  void small_tuple(std::size_t count) {
    if (stack_.size() < floor() + count) inconsistent("the stack holds too few items");
    const NodeId id = make(Kind::tuple);
    tree_.nodes[id].items.assign(stack_.end() - static_cast<std::ptrdiff_t>(count), stack_.end());
    stack_.resize(stack_.size() - count);
    push(id);
  }

  void append() {
    const NodeId value = pop();
    container(top(), Kind::list).items.push_back(value);
  }

  void set_item() {
    const NodeId value = pop();
    const NodeId key = pop();
    Node& dict = container(top(), Kind::dict);
    dict.items.push_back(key);
    dict.items.push_back(value);
  }

  void extend(Kind kind) {
    const std::size_t mark = pop_mark();
    if (kind == Kind::dict && (stack_.size() - mark) % 2 != 0) inconsistent("SETITEMS with an odd number of items");
    if (mark <= floor()) inconsistent("no container below the MARK");
    Node& target = container(stack_[mark - 1], kind);
    target.items.insert(target.items.end(), stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
  }

  void push_integer(bool negative, std::uint64_t magnitude) {
    const NodeId id = make(Kind::integer);
    tree_.nodes[id].integer = Integer{negative && magnitude != 0, false, magnitude};
    push(id);
  }

  // LONG1/LONG4: little-endian two's complement of any length.
  void long_integer(std::uint64_t length) {
    const std::span<const std::byte> raw = take(length);
    if (raw.empty()) {
      push_integer(false, 0);
      return;
    }
    const bool negative = (std::to_integer<unsigned>(raw.back()) & 0x80u) != 0;
    const std::uint8_t extension = negative ? 0xff : 0x00;
    Integer value{};
    value.negative = negative;
    // Bytes past the 8th must only extend the sign for the value to fit in 64 bits.
    for (std::size_t i = 8; i < raw.size(); ++i) {
      if (std::to_integer<std::uint8_t>(raw[i]) != extension) value.too_big = true;
    }
    std::uint64_t bits = 0;
    const std::size_t low = raw.size() < 8 ? raw.size() : 8;
    for (std::size_t i = low; i-- > 0;) bits = (bits << 8) | std::to_integer<std::uint64_t>(raw[i]);
    if (negative) {
      if (low < 8) bits |= ~std::uint64_t{0} << (8 * low);
      // A value below -2^64 + 1 or one whose low 8 bytes read as non-negative
      // does not fit: -2^63 .. -1 sign-extends, the rest is too big.
      if (raw.size() > 8 && (bits >> 63) == 0) value.too_big = true;
      value.magnitude = ~bits + 1;
    } else {
      value.magnitude = bits;
    }
    const NodeId id = make(Kind::integer);
    tree_.nodes[id].integer = value;
    push(id);
  }

  void push_text(Kind kind, std::uint64_t length) {
    const std::span<const std::byte> raw = take(length);  // checked against the bytes left first
    const NodeId id = make(kind);
    tree_.nodes[id].text.assign(reinterpret_cast<const char*>(raw.data()), raw.size());
    push(id);
  }

  std::span<const std::byte> bytes_;
  std::size_t position_ = 0;
  std::size_t op_offset_ = 0;
  std::uint8_t op_ = 0;
  Tree tree_;
  std::vector<NodeId> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint32_t, NodeId> memo_;
};

}  // namespace

const char* to_string(Kind kind) noexcept {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::text: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
  }
  return "?";
}

Tree parse(std::span<const std::byte> bytes) { return Unpickler(bytes).run(); }

const NodeId* find(const Tree& tree, const Node& dict, std::string_view key) {
  // Linear, from the end so a repeated key resolves as in Python. The mapper
  // looks up a handful of keys once per distinct dict node.
  for (std::size_t i = dict.items.size(); i >= 2; i -= 2) {
    const Node& candidate = tree[dict.items[i - 2]];
    if (candidate.kind == Kind::text && candidate.text == key) return &dict.items[i - 1];
  }
  return nullptr;
}

}  // namespace cachealloc::snapshot::pickle
