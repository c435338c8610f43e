// Comm over a c10d process group (Gloo on CPU, NCCL on CUDA, or a group the user built).
// Every collective waits with the mesh's timeout and turns a failure or a timeout into an
// error that names the collective and the group, on every rank that was waiting.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#define SHARDTENSOR_COMPAT_C10D
#include <ATen/core/Tensor.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/view_as_real.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>

#include "comm/c10d_comm.h"
#include "comm/comm_debug.h"
#include "comm/fingerprint.h"
#include "comm/traced_comm.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return c10d::ReduceOp::SUM;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
    case ReduceOp::Product: return c10d::ReduceOp::PRODUCT;
    case ReduceOp::Norm: break;  // reaches the transports only as a sum of powers
  }
  TORCH_INTERNAL_ASSERT(false, "unknown ReduceOp");
}

// A tensor handed to a backend is a shallow copy: the same storage under a TensorImpl of its
// own. c10d's work objects keep their tensors and are destroyed later, on the backend's own
// thread; were that the TensorImpl a Python object holds, its release there would take the
// GIL, which aborts the process during interpreter shutdown (seen on torch 2.15:
// "terminate called without an active exception" from ProcessGroupGloo::runLoop).
at::Tensor for_backend(const at::Tensor& t) { return t.variable_data(); }

// Gloo moves real numeric types only: a bool tensor travels as its uint8 view, a complex one as
// its real view (same bytes, same storage; dim 0 keeps its meaning, so splits along it hold),
// so masks, comparison results and complex fields move like any tensor.
at::Tensor movable(const at::Tensor& t) {
  if (t.scalar_type() == at::kBool) return for_backend(t.view(at::kByte));
  return for_backend(t.is_complex() ? at::view_as_real(t) : t);
}

// What a reduction hands the backend: a complex sum or average is that of its real view, as
// torch.distributed's all_reduce does it. Planning refuses the other ops first; this guards
// the callers that reduce without a plan.
at::Tensor reducible(const at::Tensor& t, ReduceOp op) {
  check_reducible(t.scalar_type(), op);
  return movable(t);
}

// How many groups have broken in this process (comm.h: broken_group_count).
std::atomic<uint64_t> broken_groups{0};

// Why a process group is unusable, shared by every live Comm over it rather than kept by one. A
// mesh made after a failure may wrap the same torch group (Python's 1-d init_device_mesh is
// built over the world group each time); its new Comm must raise at once, not wait out the
// timeout on messages the failed collective left queued. (Shared through the live Comms, not a
// table of groups: a weak reference to a ProcessGroupGloo keeps its destructor, which joins its
// worker threads, from running.)
class GroupHealth {
 public:
  void mark_broken(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!why_.empty()) return;  // the first failure is the cause; later ones follow from it
    why_ = why;
    broken_groups.fetch_add(1, std::memory_order_relaxed);
  }
  std::string why_broken() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return why_;
  }

 private:
  mutable std::mutex mutex_;
  std::string why_;
};

class C10dComm final : public Comm {
 public:
  using Group = C10dBackend;
  // `health`: that of the live Comms over `group` (a fresh one where there are none).
  C10dComm(c10::intrusive_ptr<Group> group, std::vector<int64_t> global_ranks, int64_t my_group_rank,
           std::chrono::milliseconds timeout, std::string registered_name, std::shared_ptr<GroupHealth> health)
      : group_(std::move(group)),
        health_(std::move(health)),
        gloo_(group_->getBackendName() == "gloo"),
        nccl_(group_->getBackendName() == "nccl"),
        ranks_(std::move(global_ranks)),
        rank_(my_group_rank),
        timeout_(timeout),
        traced_(*this, TracedCollectives(std::move(registered_name), static_cast<int64_t>(ranks_.size()), group_name())) {}

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return static_cast<int64_t>(ranks_.size()); }
  const std::vector<int64_t>& global_ranks() const override { return ranks_; }
  std::string backend_name() const override { return group()->getBackendName(); }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  Comm* traced_form() override { return &traced_; }

  // Whether this Comm runs over `group`, and how that group fares.
  bool runs_over(const C10dBackend* group) const { return group_ && group_.get() == group; }
  const std::shared_ptr<GroupHealth>& health() const { return health_; }

  // Drops the backend (shutdown): the process group can then be destroyed by its owner.
  // Attachments first: the peer memory transport's waits for its peers to see its last exchange
  // (peer_memory.h), so that this process's exit cannot fail a slower peer.
  void release() {
    drop_attachments();
    group_.reset();
  }

  void all_gather(const at::Tensor& input, const at::Tensor& output) override {
    TORCH_INTERNAL_ASSERT(output.size(0) == size() && output.is_contiguous());
    std::vector<at::Tensor> inputs{movable(input.contiguous())};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int64_t i = 0; i < size(); ++i) outputs[0].push_back(movable(output).select(0, i));
    // NCCL gathers straight into the stack; its list form would gather into a buffer of its own
    // and copy out. Gloo 1.13 has only the list form (its views of `output` cost no copy), and
    // other backends may lack the flat one.
    at::Tensor stacked = movable(output);
    run("all_gather", input.nbytes(),
        [&] { return nccl_ ? group()->_allgather_base(stacked, inputs[0]) : group()->allgather(outputs, inputs); },
        [&] { return "all_gather of " + sized(input); });
  }

  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    // Other backends (a user's own ProcessGroup) may lack it: they get Comm's all_to_all form.
    if (!nccl_ && !(gloo_ && SHARDTENSOR_GLOO_HAS_REDUCE_SCATTER)) return Comm::reduce_scatter(output, input, op);
    TORCH_INTERNAL_ASSERT(input.is_contiguous() && output.is_contiguous() && input.numel() == size() * output.numel());
    // Flat: Gloo checks that the input's first dim is size() times the output's.
    at::Tensor in = reducible(input, op).view({-1}), out = reducible(output, op).view({-1});
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    run("reduce_scatter", (size() - 1) * static_cast<int64_t>(output.nbytes()),
        [&] { return group()->_reduce_scatter_base(out, in, opts); },
        [&] { return std::string("reduce_scatter(") + to_string(op) + ") of " + sized(output); });
    if (op == ReduceOp::Avg) output.div_(size());
  }

  void all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    TORCH_INTERNAL_ASSERT(tensor.is_contiguous());
    std::vector<at::Tensor> tensors{reducible(tensor, op)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    run("all_reduce", tensor.nbytes(), [&] { return group()->allreduce(tensors, opts); },
        [&] { return std::string("all_reduce(") + to_string(op) + ") of " + sized(tensor); });
    if (op == ReduceOp::Avg) tensor.div_(size());
  }

  void broadcast(const at::Tensor& tensor, int64_t root) override {
    TORCH_INTERNAL_ASSERT(tensor.is_contiguous());
    std::vector<at::Tensor> tensors{movable(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    run("broadcast", rank_ == root ? tensor.nbytes() : 0, [&] { return group()->broadcast(tensors, opts); },
        [&] { return "broadcast from group rank " + std::to_string(root) + " of " + sized(tensor); });
  }

  void barrier() override {
    run("barrier", 0, [&] { return group()->barrier(); }, [] { return std::string("barrier"); });
  }

  void all_to_all(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits) override {
    TORCH_INTERNAL_ASSERT(input.dim() == 1 && output.dim() == 1 && input.is_contiguous() && output.is_contiguous());
    int64_t sent = 0;
    for (size_t q = 0; q < input_splits.size(); ++q)
      if (static_cast<int64_t>(q) != rank_) sent += input_splits[q];
    at::Tensor in = movable(input), out = movable(output);
    std::vector<int64_t> out_splits = output_splits, in_splits = input_splits;
    // Split sizes differ per rank: the fingerprint names the dtype only; the split sizes follow
    // from the operation, which the fingerprint does name.
    run("all_to_all", sent * static_cast<int64_t>(input.element_size()), [&] { return group()->alltoall_base(out, in, out_splits, in_splits); },
        [&] { return std::string("all_to_all of ") + c10::toString(input.scalar_type()); });
  }

  std::unique_ptr<Messages> start_messages(const char* counted_as, bool counts) override {
    // NCCL would need a batched group (ncclGroupStart) for messages posted one by one.
    if (!gloo_) return Comm::start_messages(counted_as, counts);
    check_usable();
    return std::make_unique<PostedMessages>(*this, counted_as, counts);
  }

 private:
  const c10::intrusive_ptr<Group>& group() const {
    TORCH_CHECK(group_, "shardtensor: this mesh's communicator over global ranks [", join(ranks_, ", "),
                "] was released at shutdown (release_communicators); create a new mesh.");
    return group_;
  }

  using WorkType = std::decay_t<decltype(*std::declval<Group&>().barrier())>;

  static constexpr int kMessageTag = 7, kRecordTag = 8;

  static void abort_all(std::vector<c10::intrusive_ptr<WorkType>>& works) {
    for (auto& work : works) {
      try {
        work->abort();
      } catch (const std::exception&) {
      }
    }
  }

  // Gloo's point-to-point messages, posted at once. Messages between a pair of ranks match in
  // the order they were posted, and every rank runs the same sequence of batches, so one tag
  // serves them all. Sends go out at once; where fingerprints are checked, receives are posted
  // only once agree() has found every member running this batch with the sizes this rank
  // expects, so that ranks running something else raise instead of receiving the wrong bytes
  // (or aborting Gloo on a size mismatch).
  class PostedMessages final : public Messages {
   public:
    PostedMessages(C10dComm& comm, const char* counted_as, bool counts)
        : comm_(comm), counted_as_(counted_as), counts_(counts), checked_(comm.checks_fingerprints()),
          bytes_to_(comm.size(), 0), bytes_from_(comm.size(), 0) {}
    // Unwaited messages (an error unwound past wait()) must not outlive their tensors.
    ~PostedMessages() override {
      abort_all(works_);
      abort_all(record_sends_);
      std::vector<c10::intrusive_ptr<WorkType>> unread;
      for (size_t p = 0; p < record_works_.size(); ++p)
        if (record_works_[p] && !confirmed_[p]) unread.push_back(record_works_[p]);
      abort_all(unread);
    }

    void announce(const std::vector<int64_t>& bytes_to, const std::vector<int64_t>& bytes_from,
                  const std::vector<int64_t>& checked_peers) override {
      TORCH_INTERNAL_ASSERT(works_.empty() && receives_.empty(), "announce() comes before any message");
      if (!checked_) return;
      announced_ = {bytes_to, bytes_from};
      mine_ = fingerprint_of(std::string(counted_as_) + " (messages)");
      sequence_ = ++comm_.fingerprints_;
      theirs_ = at::empty({comm_.size(), kRecordWords}, at::kLong);
      confirmed_.assign(comm_.size(), false);
      record_works_.assign(comm_.size(), {});
      const auto checked = [&](int64_t p) {
        if (checked_peers.empty()) return true;
        const bool listed = std::find(checked_peers.begin(), checked_peers.end(), p) != checked_peers.end();
        TORCH_INTERNAL_ASSERT(listed || (bytes_to[p] == 0 && bytes_from[p] == 0), "a message batch moves bytes with group rank ", p,
                              " but does not check it");
        return listed;
      };
      for (int64_t p = 0; p < comm_.size(); ++p) {
        if (p == comm_.rank() || !checked(p)) continue;
        records_.push_back(record_of(mine_, sequence_, bytes_to[p]));
        std::vector<at::Tensor> in{theirs_[p]}, out{records_.back()};
        post_record(p, [&] { return comm_.group()->recv(in, static_cast<int>(p), kRecordTag); }, &record_works_[p]);
        post_record(p, [&] { return comm_.group()->send(out, static_cast<int>(p), kRecordTag); }, nullptr);
      }
    }

    void receive(int64_t peer, const at::Tensor& into) override {
      if (into.numel() == 0) return;
      bytes_from_[peer] += static_cast<int64_t>(into.nbytes());
      if (announced_) confirm(peer);
      if (checked_ && !announced_)
        receives_.push_back({peer, into});
      else
        post(into, [&](std::vector<at::Tensor>& t) { return comm_.group()->recv(t, peer, kMessageTag); });
    }
    void send(int64_t peer, const at::Tensor& from) override {
      if (from.numel() == 0) return;
      bytes_to_[peer] += static_cast<int64_t>(from.nbytes());
      post(from, [&](std::vector<at::Tensor>& t) { return comm_.group()->send(t, peer, kMessageTag); });
    }
    void wait() override {
      fault_point("messages:wait");
      int64_t bytes_sent = 0;
      for (int64_t b : bytes_to_) bytes_sent += b;
      record_collective(counted_as_, bytes_sent, counts_);
      if (announced_) {
        TORCH_INTERNAL_ASSERT(announced_->first == bytes_to_ && announced_->second == bytes_from_,
                              "a message batch moved other bytes than it announced");
        for (int64_t p = 0; p < comm_.size(); ++p)
          if (p != comm_.rank()) confirm(p);
        fault_point("messages:checked");
      } else if (checked_) {
        comm_.agree(std::string(counted_as_) + " (messages)", &bytes_to_, &bytes_from_);
        fault_point("messages:checked");
      }
      for (const Receive& r : receives_)
        post(r.into, [&](std::vector<at::Tensor>& t) { return comm_.group()->recv(t, r.peer, kMessageTag); });
      try {
        for (auto& work : record_sends_) work->wait(comm_.timeout_);
        for (auto& work : works_) work->wait(comm_.timeout_);
      } catch (const std::exception& e) {
        comm_.health_->mark_broken(e.what());
        TORCH_CHECK(false, "shardtensor: all_to_all (point-to-point) on ", comm_.group_name(), " failed or timed out (timeout ",
                    comm_.timeout_.count() / 1000.0, " s; another rank may have stopped before this collective): ", e.what());
      }
      works_.clear();
      record_sends_.clear();
    }

   private:
    struct Receive {
      int64_t peer;
      at::Tensor into;
    };

    // Waits for `peer`'s record (posted by announce) and checks it against this batch, once.
    // A mismatch leaves this rank's sends queued on the pairs: the group is unusable then.
    void confirm(int64_t peer) {
      if (peer == comm_.rank() || confirmed_[peer]) return;
      if (!record_works_[peer]) {  // a peer announce() did not check: nothing moves with it
        TORCH_INTERNAL_ASSERT(bytes_from_[peer] == 0, "a message batch received from a peer it announced nothing from");
        return;
      }
      try {
        record_works_[peer]->wait(comm_.timeout_);
      } catch (const std::exception& e) {
        comm_.health_->mark_broken(e.what());
        TORCH_CHECK(false, "shardtensor: \"", mine_.description, "\" on ", comm_.group_name(),
                    " failed or timed out while the ranks checked that they all run it (timeout ", comm_.timeout_.count() / 1000.0,
                    " s; another rank may have stopped before this collective): ", e.what());
      }
      try {
        check_record(theirs_[peer], mine_, sequence_, announced_->second[peer], comm_.group_name(), comm_.rank(), peer);
      } catch (const std::exception& e) {
        comm_.health_->mark_broken(e.what());
        deliver_own_records();
        throw;
      }
      confirmed_[peer] = true;
    }

    // Before raising on a peer whose record differs: this rank's own records must still reach
    // the others, each of which raises on it in turn. Gloo sends a message only once its
    // receiver has posted the receive; aborted at once (by the destructor), a record could be
    // withdrawn before a slower peer asked for it, and that peer, finding no record, waited out
    // the whole timeout (seen at 3 ranks: two raised at once, the third 10 s later). Every
    // member posts its record receives when it starts a batch or a check, so this wait is short;
    // a peer that never asks (one that stopped) costs the timeout, as it does without a mismatch.
    void deliver_own_records() noexcept {
      for (auto& work : record_sends_) {
        try {
          work->wait(comm_.timeout_);
        } catch (const std::exception&) {
        }
      }
    }

    template <typename Launch>
    void post_record(int64_t peer, Launch&& launch, c10::intrusive_ptr<WorkType>* keep) {
      try {
        auto work = launch();
        // A receive is waited on once, by confirm(), and a send once, by wait() or
        // deliver_own_records(): Gloo's wait() on a finished one would wait for another message.
        if (keep)
          *keep = std::move(work);
        else
          record_sends_.push_back(std::move(work));
      } catch (const std::exception& e) {
        comm_.health_->mark_broken(e.what());
        TORCH_CHECK(false, "shardtensor: \"", mine_.description, "\" on ", comm_.group_name(), " failed: the record for group rank ", peer,
                    " could not be posted (another rank may have exited or given up): ", e.what());
      }
    }

    template <typename Launch>
    void post(const at::Tensor& t, Launch&& launch) {
      TORCH_INTERNAL_ASSERT(t.is_contiguous());
      std::vector<at::Tensor> one{movable(t)};  // c10d takes the list by reference and keeps the tensor
      try {
        works_.push_back(launch(one));
      } catch (const std::exception& e) {  // Gloo refuses to post to a peer whose connection closed
        comm_.health_->mark_broken(e.what());
        TORCH_CHECK(false, "shardtensor: all_to_all (point-to-point) on ", comm_.group_name(),
                    " failed: a message could not be posted (another rank may have exited or given up): ", e.what());
      }
    }

    C10dComm& comm_;
    const char* counted_as_;
    bool counts_;
    bool checked_;
    std::vector<int64_t> bytes_to_, bytes_from_;  // by peer, this batch
    std::vector<Receive> receives_;              // posted once the members agree
    std::vector<c10::intrusive_ptr<WorkType>> works_;
    // After announce(): the bytes announced (to, from), this batch's fingerprint and sequence,
    // the records (ours, kept until sent; theirs, by group rank) and which have been checked.
    std::optional<std::pair<std::vector<int64_t>, std::vector<int64_t>>> announced_;
    Fingerprint mine_;
    int64_t sequence_ = 0;
    std::vector<at::Tensor> records_;
    at::Tensor theirs_;
    std::vector<c10::intrusive_ptr<WorkType>> record_works_;   // their records, by group rank
    std::vector<c10::intrusive_ptr<WorkType>> record_sends_;  // ours, to each checked peer
    std::vector<bool> confirmed_;
  };

  template <typename Launch>
  void run(const char* what, int64_t bytes, Launch&& launch) {
    check_usable();
    record_collective(what, bytes);
    try {
      auto work = launch();
      work->wait(timeout_);
    } catch (const std::exception& e) {
      health_->mark_broken(e.what());
      TORCH_CHECK(false, "shardtensor: ", what, " on ", group_name(), " failed or timed out (timeout ", timeout_.count() / 1000.0,
                  " s; another rank may have stopped before this collective): ", e.what());
    }
  }
  template <typename Launch, typename Describe>
  void run(const char* what, int64_t bytes, Launch&& launch, Describe&& describe) {
    if (checks_fingerprints()) agree(describe(), nullptr, nullptr);
    run(what, bytes, launch);
  }

  // After a failed or timed-out transfer the group's state is unknown (messages of it may still
  // be queued, peers may be gone): every later collective on it raises at once, through any
  // mesh over it.
  void check_usable() const {
    const std::string why = health_->why_broken();
    TORCH_CHECK(why.empty(), "shardtensor: ", group_name(), " is unusable since an earlier collective on it failed (", why,
                "), and so is every mesh over its process group. To go on, build a mesh over new groups: "
                "torch.distributed.new_group, then torch's DeviceMesh.from_group, which shardtensor takes "
                "(a 1-d init_device_mesh uses the world group again).");
  }

  static std::string sized(const at::Tensor& t) { return std::to_string(t.numel()) + " " + c10::toString(t.scalar_type()); }

  // NCCL is not checked: a record would need a device round trip per collective.
  bool checks_fingerprints() const { return gloo_ && size() > 1 && message_fingerprints_enabled(); }

  // The fingerprint check (fingerprint.h) before a collective or a message batch on Gloo, with
  // one sequence and one tag for both, so that a rank running a batch where a peer runs a
  // collective is caught too: every member sends every other its record and checks theirs,
  // before any byte of what it describes is received. A batch passes the bytes this rank sends
  // each peer (`bytes_to`) and expects from each (`bytes_from`); a collective's sizes follow
  // from its description. Direct messages take one step (c10d's all_gather would queue on its
  // worker thread and take n-1).
  void agree(const std::string& collective, const std::vector<int64_t>* bytes_to, const std::vector<int64_t>* bytes_from) {
    check_usable();
    const Fingerprint mine = fingerprint_of(collective);
    const int64_t sequence = ++fingerprints_;
    at::Tensor theirs = at::empty({size(), kRecordWords}, at::kLong);
    std::vector<at::Tensor> records;  // alive until sent
    std::vector<c10::intrusive_ptr<WorkType>> works;
    try {
      for (int64_t p = 0; p < size(); ++p) {
        if (p == rank_) continue;
        records.push_back(record_of(mine, sequence, bytes_to ? (*bytes_to)[p] : -1));
        std::vector<at::Tensor> in{theirs[p]}, out{records.back()};
        works.push_back(group()->recv(in, static_cast<int>(p), kRecordTag));
        works.push_back(group()->send(out, static_cast<int>(p), kRecordTag));
      }
      for (auto& work : works) work->wait(timeout_);
    } catch (const std::exception& e) {
      health_->mark_broken(e.what());
      abort_all(works);
      TORCH_CHECK(false, "shardtensor: \"", mine.description, "\" on ", group_name(),
                  " failed or timed out while the ranks checked that they all run it (timeout ", timeout_.count() / 1000.0,
                  " s; another rank may have stopped before this collective): ", e.what());
    }
    fault_point("messages:agreed");
    try {
      for (int64_t p = 0; p < size(); ++p)
        if (p != rank_) check_record(theirs[p], mine, sequence, bytes_from ? (*bytes_from)[p] : -1, group_name(), rank_, p);
    } catch (const std::exception& e) {
      // The ranks are out of step: a peer's batch may have posted bytes that this rank will
      // never read (and this rank's own sends are posted already), queued on the group for good.
      health_->mark_broken(e.what());
      throw;
    }
  }

  c10::intrusive_ptr<Group> group_;
  std::shared_ptr<GroupHealth> health_;  // whether the group is still usable, shared by its comms
  bool gloo_;                 // the backend is Gloo (fingerprints, posted messages)
  bool nccl_;                 // the backend is NCCL (collectives into flat buffers)
  int64_t fingerprints_ = 0;  // collectives and message batches checked on this group
  std::vector<int64_t> ranks_;
  int64_t rank_;
  std::chrono::milliseconds timeout_;
  TracedComm traced_;  // this group while torch.compile traces
};

// Every C10dComm made, so that release_communicators() can drop their backends at shutdown.
struct CommRegistry {
  std::mutex mutex;
  std::vector<std::weak_ptr<C10dComm>> comms;
};

CommRegistry& registry() {
  static CommRegistry* r = new CommRegistry();  // leaked: used from atexit handlers
  return *r;
}

}  // namespace

uint64_t broken_group_count() { return broken_groups.load(std::memory_order_relaxed); }

void release_communicators() {
  CommRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& weak : r.comms)
    if (auto comm = weak.lock()) comm->release();
  r.comms.clear();
}

std::shared_ptr<Comm> c10d_comm_numbered(int64_t number) {
  CommRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& weak : r.comms)
    if (auto comm = weak.lock(); comm && comm->number() == number) return comm;
  return nullptr;
}

std::shared_ptr<Comm> make_c10d_comm(c10::intrusive_ptr<C10dBackend> group, std::vector<int64_t> global_ranks,
                                     int64_t my_group_rank, std::chrono::milliseconds timeout, std::string registered_name) {
  CommRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.comms.erase(std::remove_if(r.comms.begin(), r.comms.end(), [](const auto& w) { return w.expired(); }), r.comms.end());
  std::shared_ptr<GroupHealth> health;
  for (const auto& weak : r.comms)
    if (auto other = weak.lock(); other && other->runs_over(group.get())) health = other->health();
  if (!health) health = std::make_shared<GroupHealth>();
  auto comm = std::make_shared<C10dComm>(std::move(group), std::move(global_ranks), my_group_rank, timeout, std::move(registered_name),
                                         std::move(health));
  r.comms.push_back(comm);
  return comm;
}

}  // namespace shardtensor
