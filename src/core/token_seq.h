// TokenSeq: the tokens of one sequence, prompt then generated (internal).
//
// The prompt never changes once set, so it is held through a shared_ptr: the children forked
// from a parent (n > 1 sampling) share the parent's prompt instead of each holding a copy
// (with a 16k-token prompt and n = 1000 the copies were ~200 MiB of allocations and page faults
// in fork()). The generated tokens are the sequence's own. Readers that need a contiguous run
// get a pointer into one of the two parts, or a copy in their scratch buffer only for a run
// that straddles the prompt's end.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

namespace pagedkv {

class TokenSeq {
 public:
  // A new prompt, no generated tokens.
  void assign(const int32_t* prompt, size_t n) {
    prompt_ = std::make_shared<const std::vector<int32_t>>(prompt, prompt + n);
    generated_.clear();
  }
  // The prompt of `other`, shared; no generated tokens.
  void share_prompt(const TokenSeq& other) {
    prompt_ = other.prompt_;
    generated_.clear();
  }
  void clear() {
    prompt_.reset();
    generated_.clear();
  }
  void push_back(int32_t token) { generated_.push_back(token); }
  // The last generated token (there must be one): read, or replaced once its value is known
  // (Scheduler::resolve() puts the sampled token where advance() left a placeholder).
  int32_t last_generated() const { return generated_.back(); }
  void set_last_generated(int32_t token) { generated_.back() = token; }

  size_t num_prompt() const { return prompt_ ? prompt_->size() : 0; }
  size_t size() const { return num_prompt() + generated_.size(); }
  const int32_t* prompt_data() const { return prompt_ ? prompt_->data() : nullptr; }

  // Tokens [begin, begin + n) as one array: in place when they lie in one part, else copied
  // into *scratch.
  const int32_t* range(size_t begin, size_t n, std::vector<int32_t>* scratch) const {
    const size_t np = num_prompt();
    if (begin >= np) return generated_.data() + (begin - np);
    if (begin + n <= np) return prompt_->data() + begin;
    scratch->resize(n);
    copy_to(begin, n, scratch->data());
    return scratch->data();
  }
  // Copies tokens [begin, begin + n) to out.
  void copy_to(size_t begin, size_t n, int32_t* out) const {
    const size_t np = num_prompt();
    if (begin < np) {
      const size_t k = std::min(n, np - begin);
      std::copy_n(prompt_->data() + begin, k, out);
      begin += k, n -= k, out += k;
    }
    if (n > 0) std::copy_n(generated_.data() + (begin - np), n, out);
  }
  std::vector<int32_t> to_vector() const {
    std::vector<int32_t> v(size());
    copy_to(0, v.size(), v.data());
    return v;
  }

 private:
  std::shared_ptr<const std::vector<int32_t>> prompt_;
  std::vector<int32_t> generated_;
};

}  // namespace pagedkv
