// Python bindings of the scheduler: SchedulerConfig, Scheduler, StepPlan. The plan's arrays are
// zero-copy numpy views of the scheduler's preallocated buffers (valid until the next
// schedule()); each view keeps the plan, and through it the scheduler, alive.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagedkv/block_allocator.h"
#include "pagedkv/error.h"
#include "pagedkv/scheduler.h"
#include "python/bindings.h"
#include "python/int_arg.h"

namespace nb = nanobind;

namespace pagedkv::python {
namespace {

// The Python Scheduler: the C++ one plus the Python str of every live request id, by slot, so
// that plan.request_ids and update() build their lists without creating strings.
class PyScheduler : public Scheduler {
 public:
  using Scheduler::Scheduler;
  void remember(int32_t slot, nb::object id) {
    if (static_cast<size_t>(slot) >= ids_.size()) ids_.resize(static_cast<size_t>(slot) + 1);
    ids_[static_cast<size_t>(slot)] = std::move(id);
  }
  nb::list ids_of(const int32_t* slots, size_t n) const {
    nb::list out;
    for (size_t i = 0; i < n; ++i) {
      if (slots[i] < 0) {
        out.append(nb::none());  // aborted since schedule()
      } else {
        out.append(ids_[static_cast<size_t>(slots[i])]);
      }
    }
    return out;
  }

  std::vector<int64_t> scratch;  // sampled tokens converted to int64

  // The scheduler is single-threaded and schedule()/update() run without the GIL: a second
  // thread calling in meanwhile gets an error instead of a data race.
  struct Busy {
    explicit Busy(PyScheduler& s) : s_(s) {
      if (s_.busy_.exchange(true)) {
        throw std::runtime_error(
            "Scheduler is not thread-safe: called while another thread is inside it");
      }
    }
    ~Busy() { s_.busy_.store(false); }
    PyScheduler& s_;
  };

 private:
  std::atomic<bool> busy_{false};
  std::vector<nb::object> ids_;
};

const PyScheduler& owner_of(const StepPlan& p) {
  return *static_cast<const PyScheduler*>(p.scheduler);
}

template <typename T>
nb::ndarray<nb::numpy, T> view(const StepPlan& plan, T* data, std::initializer_list<size_t> shape) {
  static T empty[2] = {};
  return nb::ndarray<nb::numpy, T>(data != nullptr ? data : empty, shape, nb::find(&plan));
}

nb::ndarray<nb::numpy, int64_t> pairs_view(const StepPlan& plan, const BlockPairs& v) {
  static_assert(sizeof(BlockPairs::value_type) == 2 * sizeof(int64_t), "pairs are [k, 2]");
  auto* data = reinterpret_cast<int64_t*>(const_cast<BlockPairs::value_type*>(v.data()));
  return view<int64_t>(plan, data, {v.size(), 2});
}

std::vector<int32_t> to_token_ids(nb::handle obj, const char* name) {
  if (obj.is_none()) return {};
  nb::object seq = nb::borrow(obj);
  if (!nb::isinstance<nb::list>(seq) && !nb::isinstance<nb::tuple>(seq) &&
      nb::hasattr(seq, "tolist")) {
    seq = seq.attr("tolist")();  // numpy / torch / jax arrays
  }
  std::vector<int64_t> raw;
  if (!nb::try_cast(seq, raw)) {
    throw TypeError(std::string(name) + ": expected a sequence of ints");
  }
  std::vector<int32_t> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    PAGEDKV_CHECK(raw[i] >= 0 && raw[i] <= std::numeric_limits<int32_t>::max(), name, ": token ", i,
                  " is out of range (", raw[i], ")");
    out[i] = static_cast<int32_t>(raw[i]);
  }
  return out;
}

// The whole UTF-8 text of a str: std::string(s.c_str()) would stop at an embedded NUL, so ids
// "a\0b" and "a\0c" would both become "a" (one request shadowing the other, neither abortable
// by its real id).
std::string utf8(nb::handle s) {
  Py_ssize_t n = 0;
  const char* c = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
  if (c == nullptr) throw nb::python_error();
  return std::string(c, static_cast<size_t>(n));
}

// A request id argument: a str (TypeError naming the argument otherwise).
std::string to_id(nb::handle id, const char* name) {
  if (!nb::isinstance<nb::str>(id)) {
    throw TypeError(std::string(name) + " must be a str, got " + nb::type_name(id.type()).c_str());
  }
  return utf8(id);
}

// cache_salt: None, an int of 64 bits (signed or unsigned), or a str hashed with FNV-1a over
// all its UTF-8 bytes (stable across processes, unlike hash()).
uint64_t to_salt(nb::handle salt) {
  if (salt.is_none()) return 0;
  if (nb::isinstance<nb::str>(salt)) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : utf8(salt)) h = (h ^ c) * 1099511628211ull;
    return h;
  }
  if (PyIndex_Check(salt.ptr())) {  // int, numpy / torch integer scalars
    const nb::object index = nb::steal(PyNumber_Index(salt.ptr()));
    if (!index.is_valid()) throw nb::python_error();
    int64_t s = 0;
    if (nb::try_cast(index, s, false)) return static_cast<uint64_t>(s);
    uint64_t u = 0;
    if (nb::try_cast(index, u, false)) return u;
    throw ValueError("cache_salt must fit in 64 bits, got " + std::string(nb::str(salt).c_str()));
  }
  throw TypeError(std::string("cache_salt must be None, an int or a str, got ") +
                  nb::type_name(salt.type()).c_str());
}

PreemptionMode to_mode(const std::string& s) {
  if (s == "recompute") return PreemptionMode::kRecompute;
  if (s == "swap") return PreemptionMode::kSwap;
  throw ValueError("preemption_mode must be 'recompute' or 'swap', got '" + s + "'");
}

SchedulingPolicy to_policy(const std::string& s) {
  if (s == "fcfs") return SchedulingPolicy::kFcfs;
  if (s == "priority") return SchedulingPolicy::kPriority;
  throw ValueError("policy must be 'fcfs' or 'priority', got '" + s + "'");
}

// A finished sequence as Python sees it: its id and vLLM's finish_reason / stop_reason.
struct PyFinished {
  nb::object request_id;
  FinishReason reason;
  int32_t stop_token_id;
};

nb::object finished_object(const Finished& f, nb::object id) {
  if (f.reason == FinishReason::kNone) return nb::none();
  return nb::cast(PyFinished{std::move(id), f.reason, f.stop_token_id});
}

nb::list finished_list(const PyScheduler& s, const std::vector<Finished>& done) {
  nb::list out;
  for (const Finished& f : done) {
    out.append(finished_object(f, s.ids_of(&f.slot, 1)[0]));
  }
  return out;
}

nb::list update(PyScheduler& s, const StepPlan& plan, const int64_t* sampled, size_t n) {
  const std::vector<Finished>* finished;
  {
    PyScheduler::Busy busy(s);
    nb::gil_scoped_release release;
    finished = &s.update(plan, sampled, n);
  }
  return finished_list(s, *finished);
}

nb::list resolve(PyScheduler& s, const int64_t* sampled, size_t n) {
  const std::vector<Finished>* finished;
  {
    PyScheduler::Busy busy(s);
    nb::gil_scoped_release release;
    finished = &s.resolve(sampled, n);
  }
  return finished_list(s, *finished);
}

// Sampled tokens from a numpy int64 array without a copy, or from any sequence of ints.
template <typename F>
nb::list with_tokens(PyScheduler& s, nb::handle sampled, F&& apply) {
  nb::ndarray<const int64_t, nb::ndim<1>, nb::device::cpu, nb::c_contig> arr;
  if (nb::try_cast(sampled, arr, false)) return apply(arr.data(), arr.shape(0));
  s.scratch.clear();
  nb::object seq = nb::borrow(sampled);
  if (nb::hasattr(seq, "tolist")) seq = seq.attr("tolist")();
  if (!nb::try_cast(seq, s.scratch)) {
    throw TypeError("sampled_token_ids: expected a sequence of ints");
  }
  return apply(s.scratch.data(), s.scratch.size());
}

void bind_finished(nb::module_& m) {
  nb::class_<PyFinished>(m, "FinishedRequest",
                         "A sequence the scheduler finished: request_id, reason ('stop' for an "
                         "EOS or stop id, 'length' for max_tokens) and stop_token_id (the stop "
                         "id that ended it; None for EOS and length).")
      .def_prop_ro(
          "request_id", [](const PyFinished& f) { return f.request_id; },
          nb::sig("def request_id(self) -> str"))
      .def_prop_ro("reason", [](const PyFinished& f) { return finish_reason_name(f.reason); })
      .def_prop_ro("stop_token_id",
                   [](const PyFinished& f) -> std::optional<int32_t> {
                     if (f.reason != FinishReason::kStopToken) return std::nullopt;
                     return f.stop_token_id;
                   })
      .def_prop_ro("is_eos", [](const PyFinished& f) { return f.reason == FinishReason::kEos; })
      .def("__repr__", [](const PyFinished& f) {
        std::string r =
            "FinishedRequest(request_id=" + std::string(nb::repr(f.request_id).c_str()) +
            ", reason='" + finish_reason_name(f.reason) + "'";
        if (f.reason == FinishReason::kStopToken) {
          r += ", stop_token_id=" + std::to_string(f.stop_token_id);
        }
        return r + ")";
      });
}

void bind_config(nb::module_& m) {
  nb::class_<SchedulerConfig>(
      m, "SchedulerConfig",
      "Scheduler settings (vLLM names). Raises ValueError naming a bad field.")
      .def(
          "__init__",
          [](SchedulerConfig* c, nb::handle num_blocks, nb::handle block_size,
             nb::handle max_num_seqs, nb::handle max_num_batched_tokens,
             bool enable_chunked_prefill, bool enable_prefix_caching, nb::handle num_cpu_blocks,
             const std::string& preemption_mode, const std::string& policy,
             nb::handle max_model_len) {
            SchedulerConfig v;
            v.num_blocks = int_arg<int32_t>(num_blocks, "num_blocks");
            v.block_size = int_arg<int32_t>(block_size, "block_size");
            v.max_num_seqs = int_arg<int32_t>(max_num_seqs, "max_num_seqs");
            v.max_num_batched_tokens =
                int_arg<int32_t>(max_num_batched_tokens, "max_num_batched_tokens");
            v.enable_chunked_prefill = enable_chunked_prefill;
            v.enable_prefix_caching = enable_prefix_caching;
            v.num_cpu_blocks = int_arg<int32_t>(num_cpu_blocks, "num_cpu_blocks");
            v.preemption_mode = to_mode(preemption_mode);
            v.policy = to_policy(policy);
            if (!max_model_len.is_none()) {
              v.max_model_len = int_arg<int32_t>(max_model_len, "max_model_len");
              PAGEDKV_CHECK(v.max_model_len > 0, "max_model_len must be > 0 or None, got ",
                            v.max_model_len);
            }
            v.validate();
            new (c) SchedulerConfig(v);
          },
          // The stub keeps the int types the handles above are checked against.
          nb::sig("def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int = 256, "
                  "max_num_batched_tokens: int = 2048, enable_chunked_prefill: bool = True, "
                  "enable_prefix_caching: bool = True, num_cpu_blocks: int = 0, "
                  "preemption_mode: str = 'recompute', policy: str = 'fcfs', "
                  "max_model_len: int | None = None) -> None"),
          nb::arg("num_blocks").none(), nb::arg("block_size").none(),
          nb::arg("max_num_seqs").none() = 256, nb::arg("max_num_batched_tokens").none() = 2048,
          nb::arg("enable_chunked_prefill") = true, nb::arg("enable_prefix_caching") = true,
          nb::arg("num_cpu_blocks").none() = 0, nb::arg("preemption_mode") = "recompute",
          nb::arg("policy") = "fcfs", nb::arg("max_model_len").none() = nb::none())
      .def_ro("num_blocks", &SchedulerConfig::num_blocks)
      .def_ro("block_size", &SchedulerConfig::block_size)
      .def_ro("max_num_seqs", &SchedulerConfig::max_num_seqs)
      .def_ro("max_num_batched_tokens", &SchedulerConfig::max_num_batched_tokens)
      .def_ro("enable_chunked_prefill", &SchedulerConfig::enable_chunked_prefill)
      .def_ro("enable_prefix_caching", &SchedulerConfig::enable_prefix_caching)
      .def_ro("num_cpu_blocks", &SchedulerConfig::num_cpu_blocks)
      .def_prop_ro("preemption_mode",
                   [](const SchedulerConfig& c) {
                     return c.preemption_mode == PreemptionMode::kSwap ? "swap" : "recompute";
                   })
      .def_prop_ro("policy",
                   [](const SchedulerConfig& c) {
                     return c.policy == SchedulingPolicy::kPriority ? "priority" : "fcfs";
                   })
      .def_prop_ro("max_model_len", &SchedulerConfig::effective_max_model_len,
                   "Longest prompt + max_tokens (default: num_blocks * block_size)")
      .def_prop_ro("max_blocks_per_seq", &SchedulerConfig::max_blocks_per_seq,
                   "Row width of StepPlan.block_tables")
      .def("__repr__", [](const SchedulerConfig& c) {
        auto b = [](bool v) { return v ? "True" : "False"; };
        return "SchedulerConfig(num_blocks=" + std::to_string(c.num_blocks) +
               ", block_size=" + std::to_string(c.block_size) +
               ", max_num_seqs=" + std::to_string(c.max_num_seqs) +
               ", max_num_batched_tokens=" + std::to_string(c.max_num_batched_tokens) +
               ", enable_chunked_prefill=" + b(c.enable_chunked_prefill) +
               ", enable_prefix_caching=" + b(c.enable_prefix_caching) +
               ", num_cpu_blocks=" + std::to_string(c.num_cpu_blocks) + ", preemption_mode='" +
               (c.preemption_mode == PreemptionMode::kSwap ? "swap" : "recompute") + "', policy='" +
               (c.policy == SchedulingPolicy::kPriority ? "priority" : "fcfs") +
               "', max_model_len=" + std::to_string(c.effective_max_model_len()) + ")";
      });
}

void bind_plan(nb::module_& m) {
  using P = StepPlan;
  nb::class_<P>(m, "StepPlan",
                "One step's batch: prefills first, then decodes. Arrays are views valid until "
                "the next schedule(). Apply blocks_to_swap_out, blocks_to_swap_in, then "
                "blocks_to_copy before running the model. block_tables is padded with 0.")
      .def_ro("num_seqs", &P::num_seqs)
      .def_ro("num_prefills", &P::num_prefills)
      .def_ro("num_prefill_tokens", &P::num_prefill_tokens)
      .def_ro("num_decode_tokens", &P::num_decode_tokens)
      .def_ro("num_tokens", &P::num_tokens)
      .def_ro("max_query_len", &P::max_query_len)
      .def_ro("max_prefill_seq_len", &P::max_prefill_seq_len)
      .def_ro("max_decode_seq_len", &P::max_decode_seq_len)
      .def_ro("max_blocks_per_seq", &P::max_blocks_per_seq)
      .def_ro("step", &P::step)
      .def_ro("num_draft_tokens_total", &P::num_draft_tokens_total,
              "Draft tokens fed in this step (0: no speculative entry)")
      .def_prop_ro(
          "num_draft_tokens",
          [](P& p) {
            return view<int32_t>(p, p.num_draft_tokens.data(), {static_cast<size_t>(p.num_seqs)});
          },
          "[num_seqs] int32 draft tokens fed after each entry's last token (speculative "
          "decoding; such an entry is laid out with the prefills)")
      .def("__len__", [](const P& p) { return p.num_seqs; })
      .def_prop_ro(
          "request_ids", [](const P& p) { return owner_of(p).ids_of(p.slots.data(), p.num_seqs); },
          "list[str] in batch order (None for an entry aborted since schedule())")
      .def_prop_ro(
          "preempted_ids",
          [](const P& p) {
            return owner_of(p).ids_of(p.preempted_slots.data(), p.preempted_slots.size());
          },
          "Requests recompute-preempted this step (they resume later, losing nothing)")
#define PAGEDKV_VIEW(name, type, count, doc)                                                    \
  .def_prop_ro(                                                                                 \
      #name, [](P& p) { return view<type>(p, p.name.data(), {static_cast<size_t>(p.count)}); }, \
      doc)
          PAGEDKV_VIEW(input_ids, int32_t, num_tokens, "[num_tokens] int32") PAGEDKV_VIEW(
              positions, int64_t, num_tokens,
              "[num_tokens] int64") PAGEDKV_VIEW(slot_mapping, int64_t, num_tokens,
                                                 "[num_tokens] int64 block*block_size+offset")
              PAGEDKV_VIEW(seq_lens, int32_t, num_seqs, "[num_seqs] int32 context + query")
                  PAGEDKV_VIEW(context_lens, int32_t, num_seqs,
                               "[num_seqs] int32 tokens cached before")
                      PAGEDKV_VIEW(query_start_loc, int32_t, num_seqs + 1, "[num_seqs + 1] int32")
                          PAGEDKV_VIEW(seq_start_loc, int32_t, num_seqs + 1, "[num_seqs + 1] int32")
                              PAGEDKV_VIEW(sample_indices, int32_t, num_seqs,
                                           "[num_seqs] int32 token index sampled for each entry, "
                                           "-1 = partial chunk")
#undef PAGEDKV_VIEW
      .def_prop_ro(
          "block_tables",
          [](P& p) {
            return view<int32_t>(
                p, p.block_tables.get(),
                {static_cast<size_t>(p.num_seqs), static_cast<size_t>(p.max_blocks_per_seq)});
          },
          "[num_seqs, max_blocks_per_seq] int32, padded with 0")
      .def_prop_ro(
          "blocks_to_swap_out", [](P& p) { return pairs_view(p, p.blocks_to_swap_out); },
          "[k, 2] int64 (device block, host block)")
      .def_prop_ro(
          "blocks_to_swap_in", [](P& p) { return pairs_view(p, p.blocks_to_swap_in); },
          "[k, 2] int64 (host block, device block)")
      .def_prop_ro(
          "blocks_to_copy", [](P& p) { return pairs_view(p, p.blocks_to_copy); },
          "[k, 2] int64 (src block, dst block)")
      .def("__repr__", [](const P& p) {
        return "StepPlan(step=" + std::to_string(p.step) +
               ", num_seqs=" + std::to_string(p.num_seqs) +
               ", num_prefills=" + std::to_string(p.num_prefills) +
               ", num_tokens=" + std::to_string(p.num_tokens) + ")";
      });
}

}  // namespace

void bind_scheduler(nb::module_& m) {
  bind_config(m);
  bind_finished(m);
  bind_plan(m);
  using S = PyScheduler;
  nb::class_<S>(m, "Scheduler", "Continuous-batching scheduler over a paged KV cache (C++).")
      .def(nb::init<const SchedulerConfig&>(), nb::arg("config"))
      .def_prop_ro("config", [](const S& s) { return s.config(); })
      .def(
          "add_request",
          [](S& s, nb::handle request_id, nb::handle prompt_token_ids, nb::handle max_tokens,
             std::optional<int64_t> eos_token_id, nb::handle eos_token_ids,
             nb::handle stop_token_ids, nb::handle priority, bool ignore_eos, nb::handle min_tokens,
             nb::handle cache_salt) {
            const std::string id = to_id(request_id, "request_id");
            std::vector<int32_t> prompt = to_token_ids(prompt_token_ids, "prompt_token_ids");
            RequestParams p;
            p.max_tokens = int_arg<int32_t>(max_tokens, "max_tokens");
            PAGEDKV_CHECK(!eos_token_id || (*eos_token_id >= 0 && *eos_token_id <= INT32_MAX),
                          "eos_token_id out of range");
            p.eos_token_ids = to_token_ids(eos_token_ids, "eos_token_ids");
            if (eos_token_id) p.eos_token_ids.push_back(static_cast<int32_t>(*eos_token_id));
            p.stop_token_ids = to_token_ids(stop_token_ids, "stop_token_ids");
            p.priority = int_arg<int32_t>(priority, "priority");
            p.ignore_eos = ignore_eos;
            p.min_tokens = int_arg<int32_t>(min_tokens, "min_tokens");
            p.cache_salt = to_salt(cache_salt);
            S::Busy busy(s);
            int32_t slot = s.add_request(id, prompt, p);
            s.remember(slot, nb::borrow(request_id));
          },
          nb::sig("def add_request(self, request_id: str, prompt_token_ids: object, "
                  "max_tokens: int, eos_token_id: int | None = None, "
                  "eos_token_ids: object | None = (), "
                  "stop_token_ids: object | None = (), priority: int = 0, "
                  "ignore_eos: bool = False, min_tokens: int = 0, "
                  "cache_salt: object | None = 0) -> None"),
          nb::arg("request_id").none(), nb::arg("prompt_token_ids"), nb::arg("max_tokens").none(),
          nb::arg("eos_token_id") = nb::none(), nb::arg("eos_token_ids").none() = nb::tuple(),
          nb::arg("stop_token_ids").none() = nb::tuple(), nb::arg("priority").none() = 0,
          nb::arg("ignore_eos") = false, nb::arg("min_tokens").none() = 0,
          nb::arg("cache_salt").none() = 0,
          "Queue a request. It finishes on any of eos_token_ids (and eos_token_id), unless "
          "ignore_eos, or stop_token_ids, once it has min_tokens; or at max_tokens. "
          "ValueError for an empty prompt, a duplicate id, prompt + max_tokens "
          "> max_model_len, or a request that could never fit in num_blocks.")
      .def(
          "abort_request",
          [](S& s, nb::handle request_id) {
            const std::string id = to_id(request_id, "request_id");
            S::Busy busy(s);
            return s.abort_request(id);
          },
          nb::sig("def abort_request(self, request_id: str) -> bool"), nb::arg("request_id").none(),
          "Remove a request and free its blocks; False if unknown.")
      .def(
          "schedule",
          [](S& s) -> const StepPlan& {
            S::Busy busy(s);
            nb::gil_scoped_release release;
            return s.schedule();
          },
          nb::rv_policy::reference_internal, "Plan the next step (a StepPlan).")
      .def(
          "update",
          [](S& s, const StepPlan& plan, nb::handle sampled) {
            return with_tokens(s, sampled,
                               [&](const int64_t* t, size_t n) { return update(s, plan, t, n); });
          },
          nb::sig("def update(self, plan: StepPlan, sampled_token_ids: object) -> "
                  "list[FinishedRequest]"),
          nb::arg("plan"), nb::arg("sampled_token_ids"),
          "Apply a step's sampled tokens (one per plan entry, -1 where the entry does not "
          "sample). Returns the requests that finished (they are freed), with their reasons.")
      .def(
          "advance",
          [](S& s, const StepPlan& plan) {
            S::Busy busy(s);
            s.advance(plan);
          },
          nb::arg("plan"),
          "Overlap: the plan ran; each sampling entry i holds placeholder token -1 - i until "
          "resolve(). schedule() may run next.")
      .def(
          "resolve",
          [](S& s, nb::handle sampled) {
            return with_tokens(s, sampled,
                               [&](const int64_t* t, size_t n) { return resolve(s, t, n); });
          },
          nb::sig("def resolve(self, sampled_token_ids: object) -> list[FinishedRequest]"),
          nb::arg("sampled_token_ids"),
          "Overlap: the advanced step's tokens (one per entry of its plan). Returns the "
          "finished requests; their entries in a plan scheduled since become slot -1.")
      .def_prop_ro("has_unresolved_step", &S::has_unresolved_step)
      .def(
          "would_finish",
          [](S& s, nb::handle request_id, nb::handle token) {
            const std::string id = to_id(request_id, "request_id");
            const Finished f = s.would_finish(id, int_arg<int32_t>(token, "token"));
            return finished_object(f, nb::borrow(request_id));
          },
          nb::sig("def would_finish(self, request_id: str, token: int) -> "
                  "FinishedRequest | None"),
          nb::arg("request_id").none(), nb::arg("token").none(),
          "Whether `token` as the request's next token would finish it (and why).")
      .def(
          "update_accepted",
          [](S& s, const StepPlan& plan, nb::handle token_ids, nb::handle num_accepted) {
            std::vector<int64_t> tokens;
            std::vector<int32_t> counts;
            nb::object t = nb::borrow(token_ids), c = nb::borrow(num_accepted);
            if (nb::hasattr(t, "tolist")) t = t.attr("tolist")();
            if (nb::hasattr(c, "tolist")) c = c.attr("tolist")();
            if (!nb::try_cast(t, tokens)) throw TypeError("token_ids: expected a sequence of ints");
            if (!nb::try_cast(c, counts)) {
              throw TypeError("num_accepted: expected a sequence of ints");
            }
            const std::vector<Finished>* finished;
            {
              S::Busy busy(s);
              nb::gil_scoped_release release;
              finished = &s.update_accepted(plan, tokens.data(), tokens.size(), counts.data(),
                                            counts.size());
            }
            return finished_list(s, *finished);
          },
          nb::sig("def update_accepted(self, plan: StepPlan, token_ids: object, "
                  "num_accepted: object) -> list"),
          nb::arg("plan"), nb::arg("token_ids"), nb::arg("num_accepted"),
          "Speculative steps: entry i emitted num_accepted[i] tokens (its accepted drafts, then "
          "the target's token; 0 for an entry that samples nothing), concatenated in token_ids. "
          "Rejected drafts' KV blocks are given back. Returns the finished requests "
          "(FinishedRequest), as update() does.")
      .def_prop_ro(
          "num_appended", [](const S& s) { return s.num_appended(); },
          "Per entry of the last updated plan: tokens appended (fewer than emitted after a stop)")
      .def(
          "set_draft_tokens",
          [](S& s, nb::handle request_id, nb::handle draft_token_ids) {
            const std::string id = to_id(request_id, "request_id");
            std::vector<int32_t> draft = to_token_ids(draft_token_ids, "draft_token_ids");
            S::Busy busy(s);
            s.set_draft_tokens(id, draft.data(), draft.size());
          },
          nb::sig("def set_draft_tokens(self, request_id: str, draft_token_ids: object) -> None"),
          nb::arg("request_id").none(), nb::arg("draft_token_ids"),
          "Speculative decoding: tokens proposed to follow the request; the next schedule() "
          "feeds them (or fewer) after its last token if it decodes, and consumes them.")
      .def(
          "fork",
          [](S& s, nb::handle parent_id, nb::handle child_id, nb::handle first_token) {
            const std::string parent = to_id(parent_id, "parent_id");
            const std::string child = to_id(child_id, "child_id");
            S::Busy busy(s);
            Finished done = s.fork(parent, child, int_arg<int32_t>(first_token, "first_token"));
            if (done.reason == FinishReason::kNone) {
              s.remember(s.slot_of(child), nb::borrow(child_id));
            }
            return finished_object(done, nb::borrow(child_id));
          },
          nb::sig("def fork(self, parent_id: str, child_id: str, first_token: int) -> "
                  "FinishedRequest | None"),
          nb::arg("parent_id").none(), nb::arg("child_id").none(), nb::arg("first_token").none(),
          "n > 1 sampling: a child sharing the parent's prompt blocks. Returns why it finished "
          "at once (it is then freed), or None.")
      .def("has_unfinished_requests", &S::has_unfinished_requests)
      .def("get_token_ids", &S::get_token_ids, nb::arg("request_id"))
      .def("get_num_generated", &S::get_num_generated, nb::arg("request_id"))
      .def("__contains__", &S::has_request)
      .def_prop_ro("num_free_blocks", &S::num_free_blocks)
      .def_prop_ro("num_running", &S::num_running)
      .def_prop_ro("num_waiting", &S::num_waiting)
      .def_prop_ro("num_swapped", &S::num_swapped)
      .def_prop_ro("num_free_cpu_blocks",
                   [](const S& s) { return s.allocator().num_free_cpu_blocks(); })
      .def_prop_ro("num_preemptions", [](const S& s) { return s.counters().num_preemptions; })
      .def_prop_ro("prefix_cache_query_tokens",
                   [](const S& s) { return s.counters().prefix_cache_query_tokens; })
      .def_prop_ro("prefix_cache_hit_tokens",
                   [](const S& s) { return s.counters().prefix_cache_hit_tokens; })
      .def_prop_ro("kv_cache_usage", &S::kv_cache_usage, "Fraction of device blocks in use (0..1)");
}

}  // namespace pagedkv::python
