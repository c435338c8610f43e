// Checkpoint behaviour across launches of checkpoint_world_tool under shardrun: a checkpoint
// saved at 4 ranks (2x2 mesh) loads exactly at 3 and 2 ranks, and a save killed midway (a
// rank SIGKILLed after writing its data, or rank 0 after staging the metadata; Note
// [Checkpoint test kills] in src/checkpoint/save.cpp) leaves nothing loadable, or the previous
// checkpoint intact, never a mix.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "../support/run_command.h"

namespace {
namespace fs = std::filesystem;

using shardtensor::testing::RunResult;

RunResult shardrun(int ranks, const std::string& args, const std::string& env = "") {
  return shardtensor::testing::run_command("env SHARDTENSOR_TIMEOUT_S=60 " + env + " " + SHARDRUN_PATH + " -n " +
                                           std::to_string(ranks) + " --timeout 120 " + CHECKPOINT_TOOL_PATH + " " + args +
                                           " 2>&1");
}

std::string fresh_dir(const std::string& name) {
  const fs::path root = fs::temp_directory_path() / ("checkpoint_driver_" + std::to_string(::getpid()));
  fs::remove_all(root / name);
  fs::create_directories(root);
  return (root / name).string();
}

class CheckpointAcrossLaunches : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(fs::temp_directory_path() / ("checkpoint_driver_" + std::to_string(::getpid()))); }
};

TEST_F(CheckpointAcrossLaunches, SavedAtFourRanksLoadsExactlyAtThreeAndTwo) {
  const std::string dir = fresh_dir("four");
  const RunResult save = shardrun(4, "save " + dir);
  ASSERT_EQ(save.exit_code, 0) << save.output;
  for (int ranks : {3, 2, 1}) {
    const RunResult load = shardrun(ranks, "load " + dir);
    EXPECT_EQ(load.exit_code, 0) << "load at " << ranks << " ranks:\n" << load.output;
    EXPECT_NE(load.output.find("all equal"), std::string::npos) << load.output;
  }
}

TEST_F(CheckpointAcrossLaunches, RankKilledAfterWritingItsDataLeavesNoCheckpoint) {
  const std::string dir = fresh_dir("killed_data");
  const RunResult save = shardrun(4, "save " + dir, "SHARDTENSOR_CHECKPOINT_TEST_KILL=2:after_data");
  ASSERT_NE(save.exit_code, 0) << save.output;
  EXPECT_FALSE(fs::exists(dir)) << "a killed save published " << dir;
  const RunResult load = shardrun(2, "load " + dir);
  EXPECT_NE(load.exit_code, 0) << load.output;
  EXPECT_NE(load.output.find("no checkpoint at"), std::string::npos) << load.output;
}

TEST_F(CheckpointAcrossLaunches, KilledOverwriteKeepsThePreviousCheckpoint) {
  const std::string dir = fresh_dir("killed_overwrite");
  ASSERT_EQ(shardrun(4, "save " + dir + " 1").exit_code, 0);
  // Rank 0 dies with the new metadata staged but not renamed into place.
  const RunResult save = shardrun(4, "save " + dir + " 2", "SHARDTENSOR_CHECKPOINT_TEST_KILL=0:before_rename");
  ASSERT_NE(save.exit_code, 0) << save.output;
  const RunResult old_values = shardrun(3, "load " + dir + " 1");
  EXPECT_EQ(old_values.exit_code, 0) << "the previous checkpoint should load intact:\n" << old_values.output;
  // A killed rank other than 0 during the overwrite: the same.
  ASSERT_NE(shardrun(4, "save " + dir + " 3", "SHARDTENSOR_CHECKPOINT_TEST_KILL=3:after_data").exit_code, 0);
  EXPECT_EQ(shardrun(2, "load " + dir + " 1").exit_code, 0);
}

}  // namespace
