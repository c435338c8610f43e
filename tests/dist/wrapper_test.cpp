// The ShardTensor wrapper as libtorch checks a PrivateUse1 tensor, on every torch line: its
// dispatch keys (autograd and ADInplaceOrView added by libtorch), detach and set_data through
// shallow_copy_and_detach / shallow_copy_from, storage access that raises instead of reading
// garbage, the device it reports, and no need for rename_privateuse1_backend.
//
// This binary is its own process so that start-up is observed from its first line: every
// warning libtorch raises (TORCH_WARN) is recorded from main() on, and the last test asserts
// there were none; ctest also fails it on any line of output that says "warning".
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <mutex>

#include "dist/dist_fixture.h"
#include "util/torch_compat.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

// Records every TORCH_WARN of the process. Installed before the first test (below), so the
// dispatcher registration that the first mesh triggers is covered.
class RecordingWarningHandler final : public compat::MessageWarningHandler {
 public:
  void on_warning(const std::string& message) override {
    std::lock_guard<std::mutex> lock(mutex_);
    messages_.push_back(message);
  }
  std::vector<std::string> messages() {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> messages_;
};

RecordingWarningHandler& warnings() {
  static RecordingWarningHandler* handler = [] {
    auto* h = new RecordingWarningHandler();
    compat::set_warning_handler(h);
    return h;
  }();
  return *handler;
}
const bool kHandlerInstalled = (warnings(), true);  // at static initialisation, before main

// A [10, 3] tensor split by rows, uneven where the world allows (sizes 1..4 on 4 ranks).
at::Tensor uneven_rows(const at::Tensor& global) {
  std::vector<int64_t> sizes = chunk_sizes(10, world_size());
  if (world_size() == 4) sizes = {1, 4, 2, 3};
  return distribute_tensor(global, mesh_1d(), {Shard(0)}, ShardSizes{{0, sizes}});
}

}  // namespace

TEST(Wrapper, CarriesPrivateUse1WithTheAutogradKeysLibtorchAdds) {
  const at::Tensor t = uneven_rows(iota({10, 3}));
  const c10::DispatchKeySet keys = t.key_set();
  EXPECT_TRUE(keys.has(c10::DispatchKey::PrivateUse1));
  EXPECT_TRUE(keys.has(c10::DispatchKey::AutogradPrivateUse1));
  EXPECT_TRUE(keys.has(c10::DispatchKey::ADInplaceOrView));
  EXPECT_FALSE(keys.has(c10::DispatchKey::CPU)) << "the wrapper must not reach CPU kernels directly";
  // It reports the global shape and the local device, and the local piece is plain.
  EXPECT_EQ(t.sizes().vec(), (std::vector<int64_t>{10, 3}));
  EXPECT_EQ(t.device(), mesh_1d().device());
  EXPECT_FALSE(to_local(t).key_set().has(c10::DispatchKey::PrivateUse1));
}

TEST(Wrapper, DetachAndSetDataKeepTheLocalPieceAndSpec) {
  at::Tensor t = uneven_rows(iota({10, 3}));
  t.set_requires_grad(true);
  const at::Tensor d = t.detach();  // shallow_copy_and_detach
  ASSERT_TRUE(is_shard_tensor(d));
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(spec(d), spec(t));
  EXPECT_TRUE(to_local(d).is_same(to_local(t)) || to_local(d).data_ptr() == to_local(t).data_ptr());
  // In-place on the detached view is seen through the original (they share the version too).
  const auto version = t._version();
  d.mul_(2);
  EXPECT_GT(t._version(), version);
  EXPECT_TRUE(at::equal(full_tensor(t.detach()), iota({10, 3}) * 2));
  // set_data (shallow_copy_from) swaps in another ShardTensor's piece and spec.
  at::Tensor other = uneven_rows(iota({10, 3}) + 1);
  at::Tensor target = uneven_rows(iota({10, 3}));
  target.set_data(other);
  EXPECT_TRUE(at::equal(full_tensor(target), iota({10, 3}) + 1));
  EXPECT_ERROR_CONTAINS(target.set_data(at::zeros({10, 3})), "set_data");  // libtorch refuses the type mix first
}

TEST(Wrapper, StorageAccessRaisesInsteadOfReadingGarbage) {
  const at::Tensor t = uneven_rows(iota({10, 3}));
  EXPECT_THROW(t.storage(), c10::Error);
  EXPECT_THROW((void)t.data_ptr(), c10::Error);
  EXPECT_FALSE(t.has_storage());
}

TEST(Wrapper, WorksWithoutRenamingThePrivateUse1Backend) {
  // libtorch 2.x lets a PrivateUse1 backend rename itself (torch.utils.rename_privateuse1_backend)
  // and some of its code asks for the name. The wrapper never does: it reports the local
  // device (cpu or cuda), so the backend keeps its default name and nothing asks for it.
  at::Tensor t = uneven_rows(iota({10, 3}));
  EXPECT_NE(t.device().type(), c10::DeviceType::PrivateUse1);
  t.set_requires_grad(true);
  at::Tensor loss = (t * t).sum();
  loss.backward();
  EXPECT_TRUE(at::allclose(full_tensor(t.grad()), iota({10, 3}) * 2));
  EXPECT_NO_THROW((void)t.toString());  // names the type by the local device
}

// Last in this file (gtest runs a file's tests in order): every test above, and the
// start-up before them, ran without a single libtorch warning.
TEST(Wrapper, StartUpAndUseStayQuiet) {
  const std::vector<std::string> seen = warnings().messages();
  EXPECT_TRUE(seen.empty()) << "libtorch said: " << ::testing::PrintToString(seen);
}
