// What checkpoint.hpp promises when a save is cut short: the commit switches the staged group in
// with one rename (RENAME_EXCHANGE), so a save killed or failing at any file-system call of its
// commit leaves exactly one whole checkpoint, the previous or the new one, that load reads and the
// next save replaces; where the file system cannot exchange, the two-rename commit's gap (no
// directory, the previous checkpoint parked beside it) is recovered by load and the next save; a
// rank failing mid-save is reported on every rank instead of leaving its peers in a collective.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <tessera/checkpoint/checkpoint.hpp>
#include <tessera/checkpoint/detail/chunks.hpp>
#include <tessera/checkpoint/detail/faults.hpp>
#include <tessera/checkpoint/detail/files.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "checkpoint/checkpoint_test_util.hpp"
#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
namespace fs = std::filesystem;
using checkpoint::detail::CommitFault;

namespace {

constexpr double kPrevious = 0.25, kNew = 1.5, kNext = 2.75;  // the phases that tell the saves apart

// Two tensors saved together, in different layouts, with values that name the save (`phase`).
std::map<std::string, DTensor> state(const DeviceMesh& mesh, double phase) {
  return {{"w", distribute_tensor(sample_values({6, 4}, phase, DType::f32), mesh, {Shard{0}})},
          {"v", distribute_tensor(sample_values({5}, phase + 0.5, DType::f64), mesh, {Replicate{}})}};
}

// The phase of the save whose tensors the checkpoint at `dir` holds, both of them; -1 for a mix or
// anything else. Collective.
double loaded_phase(const std::string& dir, const DeviceMesh& mesh) {
  std::map<std::string, DTensor> into{{"w", distribute_tensor(zeros({6, 4}), mesh, {Replicate{}})},
                                      {"v", distribute_tensor(zeros({5}, DType::f64), mesh, {Shard{0}})}};
  checkpoint::load(dir, into);
  const Tensor w = into.at("w").full_tensor(), v = into.at("v").full_tensor();
  for (const double phase : {kPrevious, kNew, kNext})
    if (equal(w, sample_values({6, 4}, phase, DType::f32)) && equal(v, sample_values({5}, phase + 0.5, DType::f64)))
      return phase;
  return -1;
}

bool rank0_says(bool value) {
  int64_t said = value ? 1 : 0;
  world().broadcast(&said, 1, DType::i64, 0);
  return said != 0;
}

}  // namespace

// A fault at each file-system call of the commit in turn, with RENAME_EXCHANGE and without: a
// crash (the commit stops there, as a killed process would) or a failing call (EIO). After it a
// load finds one whole checkpoint: the previous one up to the switch, the new one from it on; a
// failure before the switch is reported with the previous checkpoint unchanged, one after it is no
// failure (the checkpoint is in place); the next save recovers whatever the commit left.
TEST(CheckpointCommit, AFaultAtEveryCallLeavesOneWholeCheckpoint) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const std::string dir = shared_dir("checkpoint-commit");
    checkpoint::SaveOptions unsynced;  // the saves around the one under test: no fsync needed
    unsynced.sync_files = false;
    for (const bool exchange : {true, false}) {
      for (const CommitFault fault : {CommitFault::crash, CommitFault::fail}) {
        SCOPED_TRACE(::testing::Message() << (exchange ? "RENAME_EXCHANGE" : "two renames") << ", "
                                          << (fault == CommitFault::crash ? "crash" : "failing call"));
        std::vector<double> found;  // per call: the checkpoint a load found after the fault there
        for (int64_t call = 0; call < 16; ++call) {
          SCOPED_TRACE(::testing::Message() << "fault at call " << call);
          checkpoint::save(dir, state(mesh, kPrevious), unsynced);
          if (rank() == 0) {
            checkpoint::detail::set_rename_exchange(exchange);
            checkpoint::detail::set_commit_fault(call, fault);
          }
          std::string error;
          try {
            checkpoint::save(dir, state(mesh, kNew));
          } catch (const Error& e) {
            error = e.what();
          }
          if (rank() == 0) checkpoint::detail::set_rename_exchange(true);
          if (!rank0_says(checkpoint::detail::commit_fault_reached())) {  // past the commit's last call
            EXPECT_EQ(error, "");
            EXPECT_EQ(loaded_phase(dir, mesh), kNew);
            break;
          }
          const double phase = loaded_phase(dir, mesh);  // one whole checkpoint: never a mix, never none
          EXPECT_TRUE(phase == kPrevious || phase == kNew) << phase;
          if (fault == CommitFault::crash)
            EXPECT_TRUE(contains(error, "[checkpoint::save] rank 0 stopped") && contains(error, "fault injected")) << error;
          else if (phase == kPrevious)
            EXPECT_TRUE(contains(error, "[checkpoint::save] rank 0 failed") && contains(error, "Input/output error") &&
                        contains(error, dir + " is unchanged"))
                << error;
          else
            EXPECT_EQ(error, "");  // the checkpoint is in place: its save succeeded
          found.push_back(phase);

          checkpoint::save(dir, state(mesh, kNext), unsynced);  // recovers what the commit left
          EXPECT_EQ(loaded_phase(dir, mesh), kNext);
          EXPECT_FALSE(fs::exists(dir + ".tessera-saving"));
          EXPECT_FALSE(fs::exists(dir + ".tessera-old"));
        }
        // Write the group's zarr.json, sync the staged group, the switch (one exchange, or two
        // renames), sync the parent, remove the previous checkpoint.
        EXPECT_EQ(found.size(), exchange ? 5u : 6u);
        const auto first_new = std::find(found.begin(), found.end(), kNew);
        EXPECT_GE(first_new - found.begin(), 2);  // at least the zarr.json and the sync come before the switch
        EXPECT_LT(first_new - found.begin(), static_cast<int64_t>(found.size()));
        EXPECT_TRUE(std::all_of(found.begin(), first_new, [](double p) { return p == kPrevious; }));
        EXPECT_TRUE(std::all_of(first_new, found.end(), [](double p) { return p == kNew; }));
      }
    }
    remove_shared(dir);
  });
}

// What a two-rename commit (Tessera before RENAME_EXCHANGE, or a file system without it) leaves
// when killed between its renames: no directory, the previous checkpoint parked beside it, the
// new one staged. Load reads the previous one; the next save puts it back before staging, so that
// a failing save still leaves it at the directory; a save after that replaces it.
TEST(CheckpointCommit, LoadAndSaveRecoverACheckpointParkedBesideTheDirectory) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const std::string dir = shared_dir("checkpoint-parked");
    checkpoint::save(dir, state(mesh, kPrevious));
    checkpoint::save(dir + ".tessera-saving", state(mesh, kNew));  // a whole staged group
    world().barrier();
    if (rank() == 0) fs::rename(dir, dir + ".tessera-old");
    world().barrier();
    EXPECT_EQ(loaded_phase(dir, mesh), kPrevious);

    if (rank() == 1) checkpoint::detail::set_save_fault(0);
    EXPECT_TRUE(throws_with<checkpoint::IoError>([&] { checkpoint::save(dir, state(mesh, kNext)); },
                                                 {"[checkpoint::save]", "rank 1 failed", "is unchanged"}));
    checkpoint::detail::set_save_fault(-1);
    EXPECT_TRUE(fs::is_directory(dir));
    EXPECT_EQ(loaded_phase(dir, mesh), kPrevious);

    checkpoint::save(dir, state(mesh, kNext));
    EXPECT_EQ(loaded_phase(dir, mesh), kNext);
    EXPECT_FALSE(fs::exists(dir + ".tessera-saving"));
    EXPECT_FALSE(fs::exists(dir + ".tessera-old"));
    remove_shared(dir);
  });
}

// A rank whose save fails on its first array (as on a full disk) still runs the regather of the
// array after it, a collective its peers are in: every rank reports that rank's failure, none
// waits out the communication timeout. On 2x2, [29] split (S(0), S(0)) has pieces 8 7 7 7 and is
// regathered whole; on other worlds a Partial value is reduced.
TEST(Checkpoint, ARankFailingBeforeARegatherIsReportedOnEveryRank) {
  for_each_world({2, 4}, [] {
    const int n = world_size();
    const std::string dir = shared_dir("checkpoint-regather");
    const DeviceMesh mesh = n == 4 ? DeviceMesh({2, 2}, {"dp", "tp"}) : DeviceMesh({n}, {"dp"});
    const Tensor a = sample_values({8}, 0.1, DType::f32), b = sample_values({29}, 0.2, DType::f32);
    std::map<std::string, DTensor> tensors;
    if (n == 4) {
      tensors = {{"a", distribute_tensor(a, mesh, {Shard{0}, Shard{0}})}, {"b", distribute_tensor(b, mesh, {Shard{0}, Shard{0}})}};
    } else {
      FromLocalOptions shape;
      shape.shape = b.shape();
      tensors = {{"a", distribute_tensor(a, mesh, {Shard{0}})},
                 {"b", DTensor::from_local(div(b, Scalar(static_cast<double>(n))), mesh, {Partial{}}, shape)}};
    }
    const Placements replicated(static_cast<size_t>(mesh.ndim()), Replicate{});
    const Tensor previous = sample_values({8}, 0.9, DType::f32);
    checkpoint::save(dir, {{"a", distribute_tensor(previous, mesh, replicated)}});
    if (rank() == 1) checkpoint::detail::set_save_fault(0);
    EXPECT_TRUE(throws_with<checkpoint::IoError>(
        [&] { checkpoint::save(dir, tensors); },
        {"[checkpoint::save]", "rank 1 failed", "fault injected by the test on rank 1", dir + " is unchanged"}));
    checkpoint::detail::set_save_fault(-1);
    std::map<std::string, DTensor> loaded{{"a", distribute_tensor(zeros({8}), mesh, replicated)}};
    checkpoint::load(dir, loaded);
    EXPECT_TRUE(equal(loaded.at("a").full_tensor(), previous));

    checkpoint::save(dir, tensors);  // the same save without the fault goes through
    loaded.emplace("b", distribute_tensor(zeros({29}), mesh, replicated));
    checkpoint::load(dir, loaded);
    EXPECT_TRUE(equal(loaded.at("a").full_tensor(), a));
    EXPECT_TRUE(allclose(loaded.at("b").full_tensor(), b, 1e-6, 1e-6));
    remove_shared(dir);
  });
}

// Load names what is wrong with the directory itself, and with a chunk that is not a file.
TEST(Checkpoint, LoadNamesAMissingCheckpointAndAChunkThatIsADirectory) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const std::string dir = shared_dir("checkpoint-not-there");
    std::map<std::string, DTensor> into{{"w", distribute_tensor(zeros({6, 4}), mesh, {Replicate{}})}};
    EXPECT_TRUE(throws_with<checkpoint::IoError>([&] { checkpoint::load(dir, into); },
                                                 {"[checkpoint::load]", "no checkpoint at " + dir + ": no such directory"}));
    checkpoint::save(dir, {{"w", distribute_tensor(sample_values({6, 4}, 0.3, DType::f32), mesh, {Shard{0}})}});
    const fs::path chunk = fs::path(dir) / "w" / "c.0.0";
    world().barrier();
    if (rank() == 0) {
      fs::remove(chunk);
      fs::create_directory(chunk);
    }
    world().barrier();
    EXPECT_TRUE(throws_with<checkpoint::IoError>([&] { checkpoint::load(dir, into); },
                                                 {"[checkpoint::load]", "chunk " + chunk.string() + " is a directory"}));
    remove_shared(dir);
  });
}
