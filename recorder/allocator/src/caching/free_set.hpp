// The cached blocks of one pool of one stream, in PyTorch's best-fit order:
// by size, then by address. lower_bound(size) is the best fit.
//
// Blocks of up to kBins bin widths live in size bins, one per bin width,
// each a (size, address) tree, with a two-level bitmap of the bins that hold
// a block. Best fit is the first bin at or above the request's, found with
// two countr_zero, and the lowest block in it that fits. Larger blocks live
// in one (size, address) tree that orders after all bins, so iteration,
// lower_bound and begin/end keep the exact (size, address) order across both.
//
// The small pool's bins are 512 B wide up to 2 MiB: every block size is a
// multiple of 512, so a bin is one exact size and best fit is its tree's
// cached leftmost node, in constant time. The large pool's are 64 KiB wide
// up to 256 MiB: a bin holds up to 128 sizes, and only the request's own bin
// needs a search, in a tree of that bin's few blocks. One tree for the whole
// large pool cost about 13 levels of pointer chasing per lookup with a few
// hundred blocks cached (the mixed workload: docs/PERFORMANCE.md, "What
// limits the figures").
//
// Cost: the bins (4,096 tree headers, 128 KiB per set) are allocated once,
// with the set; insert and erase touch one bin's tree and at most two bitmap
// words. No heap allocation per call.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>

namespace cachealloc {

// Tree: a boost::intrusive multiset ordered by (size, address) without
// constant-time size (the set counts its blocks itself), whose value type
// has a `size` member. All bins share the hook, as a block is in one bin.
template <class Tree>
class BinnedFreeSet {
 public:
  using value_type = typename Tree::value_type;
  static constexpr std::size_t kBins = 4096;

  // bin_width: a power of two; blocks up to kBins * bin_width are binned.
  explicit BinnedFreeSet(std::size_t bin_width)
      : bins_(std::make_unique<Tree[]>(kBins)),
        bin_shift_(static_cast<unsigned>(std::countr_zero(bin_width))),
        max_binned_(kBins * bin_width) {}
  BinnedFreeSet(const BinnedFreeSet&) = delete;
  BinnedFreeSet& operator=(const BinnedFreeSet&) = delete;

  // Bidirectional, in (size, address) order. An iterator from s_iterator_to
  // only names its block (for erase), it cannot be moved.
  class iterator {
   public:
    using iterator_category = std::bidirectional_iterator_tag;
    using value_type = typename Tree::value_type;
    using difference_type = std::ptrdiff_t;
    using pointer = value_type*;
    using reference = value_type&;

    iterator() = default;
    reference operator*() const noexcept { return *it_; }
    pointer operator->() const noexcept { return &*it_; }
    iterator& operator++() noexcept {
      ++it_;
      if (bin_ < kBins && it_ == set_->bins_[bin_].end()) {
        bin_ = set_->next_bin(bin_ + 1);
        it_ = set_->bin_tree(bin_).begin();
      }
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    iterator& operator--() noexcept {
      if (it_ == set_->bin_tree(bin_).begin()) {
        bin_ = set_->prev_bin(bin_);
        it_ = set_->bin_tree(bin_).end();
      }
      --it_;
      return *this;
    }
    iterator operator--(int) noexcept {
      iterator old = *this;
      --*this;
      return old;
    }
    // Nodes and each tree's end are distinct, so the tree iterator decides.
    friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.it_ == b.it_; }

   private:
    friend class BinnedFreeSet;
    iterator(const BinnedFreeSet* set, std::size_t bin, typename Tree::iterator it) noexcept
        : set_(set), bin_(bin), it_(it) {}
    const BinnedFreeSet* set_ = nullptr;
    std::size_t bin_ = kBins;  // kBins: the tree
    typename Tree::iterator it_;
  };
  using const_iterator = iterator;

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }

  iterator begin() const noexcept {
    const std::size_t bin = next_bin(0);
    return {this, bin, bin_tree(bin).begin()};
  }
  iterator end() const noexcept { return {this, kBins, tree().end()}; }

  void insert(value_type& block) noexcept {
    ++size_;
    if (in_bins(block.size)) {
      const std::size_t bin = bin_of(block.size);
      add(bins_[bin], block);
      words_[bin >> 6] |= std::uint64_t{1} << (bin & 63);
      summary_ |= std::uint64_t{1} << (bin >> 6);
    } else {
      add(tree_, block);
    }
  }

  // The block's size must be the one it was inserted with.
  void erase(iterator position) noexcept {
    --size_;
    value_type& block = *position;
    if (in_bins(block.size)) {
      const std::size_t bin = bin_of(block.size);
      Tree& tree = bins_[bin];
      if (remove(tree, block)) {
        std::uint64_t& word = words_[bin >> 6];
        word &= ~(std::uint64_t{1} << (bin & 63));
        if (word == 0) summary_ &= ~(std::uint64_t{1} << (bin >> 6));
      }
    } else {
      remove(tree_, block);
    }
  }

  // The first block not below `size` in (size, address) order.
  template <class SizeKey>
  iterator lower_bound(std::size_t size, SizeKey key) const noexcept {
    if (!in_bins(size)) return {this, kBins, tree().lower_bound(size, key)};
    std::size_t bin = next_bin(bin_of(size));
    auto it = bin_tree(bin).begin();
    // A bin above the request's holds only blocks that fit. The request's own
    // bin may begin with smaller blocks: never in the small pool (a bin is one
    // size there), often in the large one.
    if (bin < kBins && it->size < size) [[unlikely]] {
      it = bins_[bin].lower_bound(size, key);
      if (it == bins_[bin].end()) {
        bin = next_bin(bin + 1);
        it = bin_tree(bin).begin();
      }
    }
    return {this, bin, it};
  }

  // Names `block`, which must be in some BinnedFreeSet, for erase.
  static iterator s_iterator_to(value_type& block) noexcept {
    return {nullptr, kBins, Tree::s_iterator_to(block)};
  }

  void clear() noexcept {
    for (std::size_t bin = 0; bin < kBins; ++bin) bins_[bin].clear();
    for (std::uint64_t& word : words_) word = 0;
    summary_ = 0;
    tree_.clear();
    size_ = 0;
  }

 private:
  // Most bins hold one block or none, and a block freed last often orders
  // last in its bin: both skip the tree's search and
  // rebalancing. push_back needs the block to order last; clear() of a
  // normal_link tree only resets its header.
  // (The header's left and right are the tree's first and last nodes, the
  // header itself when it is empty: Tree's rbegin() would walk to it.)
  using NodeTraits = typename Tree::node_traits;
  using ValueTraits = typename Tree::value_traits;
  static void add(Tree& tree, value_type& block) noexcept {
    const auto header = tree.end().pointed_node();
    const auto last = NodeTraits::get_right(header);
    if (last == header || !tree.value_comp()(block, *ValueTraits::to_value_ptr(last)))
      tree.push_back(block);
    else
      tree.insert(block);
  }
  // Returns whether the tree is now empty.
  static bool remove(Tree& tree, value_type& block) noexcept {
    const auto header = tree.end().pointed_node();
    const auto node = ValueTraits::to_node_ptr(block);
    if (NodeTraits::get_left(header) == node && NodeTraits::get_right(header) == node) {  // the only one
      tree.clear();
      return true;
    }
    tree.erase(Tree::s_iterator_to(block));
    return false;
  }

  bool in_bins(std::size_t size) const noexcept { return size <= max_binned_; }
  std::size_t bin_of(std::size_t size) const noexcept { return size == 0 ? 0 : (size - 1) >> bin_shift_; }
  Tree& tree() const noexcept { return const_cast<Tree&>(tree_); }
  Tree& bin_tree(std::size_t bin) const noexcept { return bin < kBins ? bins_[bin] : tree(); }

  // The first bin at or after `from` that holds a block; kBins for none.
  std::size_t next_bin(std::size_t from) const noexcept {
    if (from >= kBins) return kBins;
    std::size_t word = from >> 6;
    const std::uint64_t bits = words_[word] & (~std::uint64_t{0} << (from & 63));
    if (bits) return (word << 6) + static_cast<std::size_t>(std::countr_zero(bits));
    const std::uint64_t later = word + 1 < 64 ? summary_ & (~std::uint64_t{0} << (word + 1)) : 0;
    if (!later) return kBins;
    word = static_cast<std::size_t>(std::countr_zero(later));
    return (word << 6) + static_cast<std::size_t>(std::countr_zero(words_[word]));
  }
  // The last bin before `below` that holds a block (kBins: before the tree).
  // Only called when there is one.
  std::size_t prev_bin(std::size_t below) const noexcept {
    const std::size_t last = below - 1;
    std::size_t word = last >> 6;
    const std::uint64_t bits = words_[word] & (~std::uint64_t{0} >> (63 - (last & 63)));
    if (bits) return (word << 6) + 63 - static_cast<std::size_t>(std::countl_zero(bits));
    const std::uint64_t earlier = summary_ & ((std::uint64_t{1} << word) - 1);
    word = 63 - static_cast<std::size_t>(std::countl_zero(earlier));
    return (word << 6) + 63 - static_cast<std::size_t>(std::countl_zero(words_[word]));
  }

  std::unique_ptr<Tree[]> bins_;  // kBins trees
  unsigned bin_shift_;            // log2 of the bin width
  std::size_t max_binned_;        // kBins bin widths
  std::uint64_t words_[kBins / 64] = {};  // bit b: bin b holds a block
  std::uint64_t summary_ = 0;             // bit w: words_[w] != 0
  Tree tree_;                             // blocks above max_binned_
  std::size_t size_ = 0;
};

}  // namespace cachealloc
