// CommDebugMode per module, as PyTorch's: calls counted against the modules whose forward issued
// them (and against the module that recorded an op, for that op's backward), the parameters'
// placements, the traced DTensor ops, the tracing table at each noise level and its JSON dump.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/runtime/runtime.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

using Counts = std::map<CollectiveKind, int64_t>;
const Counts one_gather{{CollectiveKind::all_gather, 1}};

// Gathers its Shard(0) input (one all_gather in forward; the backward only chunks), then adds.
class Inner : public nn::Module {
 public:
  explicit Inner(const DeviceMesh& mesh) : Module(mesh) {}
  DTensor forward(const DTensor& y) const {
    const nn::ForwardScope scope(*this);
    const DTensor z = y.redistribute({Replicate{}});
    return add(z, z);
  }
};

// Chunks its Replicate input to Shard(0) (no call in forward; its backward gathers the gradient,
// one all_gather), then runs `inner`. Holds a parameter for the parameter info.
class Outer : public nn::Module {
 public:
  explicit Outer(const DeviceMesh& mesh) : Module(mesh) {
    register_parameter("w", zeros({2 * mesh.size()}, mesh, {Shard{0}}));
    inner_ = register_module("inner", std::make_shared<Inner>(mesh));
  }
  DTensor forward(const DTensor& x) const {
    const nn::ForwardScope scope(*this);
    return inner_->forward(x.redistribute({Shard{0}}));
  }

 private:
  std::shared_ptr<Inner> inner_;
};

// Throws in the middle of its forward, after one all_gather.
class Failing : public nn::Module {
 public:
  explicit Failing(const DeviceMesh& mesh) : Module(mesh) {}
  DTensor forward(const DTensor& x) const {
    const nn::ForwardScope scope(*this);
    const DTensor gathered = x.redistribute({Replicate{}});
    throw std::runtime_error("forward failed after " + gathered.to_string());
  }
};

// Outer's forward on an [2n] input of 0..2n-1 that requires a gradient, then the sum's backward.
void run_outer(const Outer& model, const DeviceMesh& mesh) {
  DTensor x = DTensor::from_local(arange(2 * mesh.size()).to(DType::f32), mesh, {Replicate{}});
  x.requires_grad_();
  const DTensor out = model.forward(x);
  sum(out).backward();
}

// A file name of this rank's own (the threads backend runs every rank in one process).
std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("tessera_" + std::to_string(::getpid()) + "_" + std::to_string(world().rank()) + "_" + name))
      .string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(CommDebugModules, CountsCallsAgainstTheModulesThatIssuedThemInForwardAndBackward) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const Outer model(mesh);
    CommDebugMode mode;
    run_outer(model, mesh);
    // The forward gather is Inner's, so Outer's and Global's too; the backward gather is that of
    // the chunk Outer recorded, so Outer's and Global's, not Inner's.
    const auto& counts = mode.comm_module_counts();
    ASSERT_EQ(counts.size(), 3u);
    EXPECT_EQ(counts.at("Global"), (CommDebugMode::ModuleCounts{one_gather, one_gather}));
    EXPECT_EQ(counts.at("Outer"), (CommDebugMode::ModuleCounts{one_gather, one_gather}));
    EXPECT_EQ(counts.at("Outer.inner"), (CommDebugMode::ModuleCounts{one_gather, {}}));
    EXPECT_EQ(mode.get_comm_counts(), (Counts{{CollectiveKind::all_gather, 2}}));

    // A call outside every module counts against Global alone.
    world().barrier();
    EXPECT_EQ(mode.comm_module_counts().at("Global").forward,
              (Counts{{CollectiveKind::all_gather, 1}, {CollectiveKind::barrier, 1}}));
    EXPECT_EQ(mode.comm_module_counts().at("Outer").forward, one_gather);

    mode.reset();
    EXPECT_EQ(mode.comm_module_counts(), (std::map<std::string, CommDebugMode::ModuleCounts>{{"Global", {}}}));
    EXPECT_TRUE(mode.get_sharding_info().empty());
  });
}

TEST(CommDebugModules, ParameterAndShardingInfoAndTheTracedOps) {
  for_each_world({2, 4}, [] {
    const int64_t n = world_size();
    const DeviceMesh mesh({n}, {"x"});
    Outer model(mesh);
    CommDebugMode mode;
    run_outer(model, mesh);

    EXPECT_EQ(mode.get_sharding_info(), (std::map<std::string, Placements>{{"Outer.w", {Shard{0}}}}));
    const auto info = mode.get_parameter_info();
    ASSERT_EQ(info.size(), 1u);  // Inner has no parameters
    const DTensor& w = info.at("Outer").at("w");
    EXPECT_EQ(w.shape(), Shape({2 * n}));
    EXPECT_EQ(w.placements(), Placements({Shard{0}}));
    EXPECT_EQ(w.to_local().storage(), model.parameter("w").to_local().storage());  // the module's own

    // Inner ran one DTensor op in forward, add of its gathered input to itself.
    const auto& ops = mode.module_operations();
    ASSERT_TRUE(ops.count("Outer.inner"));
    std::vector<CommDebugMode::TracedOp> forward_ops;
    for (const auto& op : ops.at("Outer.inner"))
      if (!op.backward) forward_ops.push_back(op);
    ASSERT_EQ(forward_ops.size(), 1u);
    EXPECT_EQ(forward_ops[0].name, "add");
    EXPECT_EQ(forward_ops[0].input_shapes, (std::vector<Shape>{Shape({2 * n}), Shape({2 * n})}));
    EXPECT_EQ(forward_ops[0].input_placements, (std::vector<Placements>{{Replicate{}}, {Replicate{}}}));
    EXPECT_EQ(forward_ops[0].device_mesh, mesh.to_string());
    // The sum ran outside every module; the backward's own sums of gradients (z + z's two
    // gradients of z) run in backward outside every module too.
    ASSERT_TRUE(ops.count("Global"));
    std::vector<std::string> global_forward;
    for (const auto& op : ops.at("Global"))
      if (!op.backward) global_forward.push_back(op.name);
    EXPECT_EQ(global_forward, std::vector<std::string>{"sum"});
  });
}

TEST(CommDebugModules, TracingTableAtEachNoiseLevel) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const Outer model(mesh);
    CommDebugMode mode;
    run_outer(model, mesh);
    // PyTorch's layout: a module per line, indented four spaces a level, its passes two more,
    // their calls four more.
    EXPECT_EQ(mode.generate_comm_debug_tracing_table(0),
              "Global\n"
              "  FORWARD PASS\n"
              "    *all_gather: 1\n"
              "  BACKWARD PASS\n"
              "    *all_gather: 1\n"
              "    Outer\n"
              "      FORWARD PASS\n"
              "        *all_gather: 1\n"
              "      BACKWARD PASS\n"
              "        *all_gather: 1\n"
              "        Outer.inner\n"
              "          FORWARD PASS\n"
              "            *all_gather: 1\n");
    // Level 1 adds the module data and the DTensor ops with their inputs.
    const std::string one = mode.generate_comm_debug_tracing_table(1);
    EXPECT_NE(one.find("    Outer\n"
                       "    *module type: Outer\n"
                       "    *Parameter List\n"
                       "     *w: (S(0))\n"),
              std::string::npos)
        << one;
    EXPECT_NE(one.find("        Outer.inner\n"
                       "        *module type: Inner\n"
                       "          FORWARD PASS\n"
                       "            *all_gather: 1\n"
                       "            **add\n"
                       "              shape: [[" +
                       std::to_string(2 * mesh.size()) + "], [" + std::to_string(2 * mesh.size()) +
                       "]]\n"
                       "              sharding: [(R), (R)]\n"
                       "              device mesh: " +
                       mesh.to_string() + "\n"),
              std::string::npos)
        << one;
    EXPECT_EQ(mode.generate_comm_debug_tracing_table(2), one);  // Tessera traces DTensor ops only
    EXPECT_EQ(mode.generate_comm_debug_tracing_table(), mode.generate_comm_debug_tracing_table(3));

    // The file holds the same table.
    const std::string path = temp_path("comm_mode_log.txt");
    mode.log_comm_debug_tracing_table_to_file(path, 0);
    EXPECT_EQ(read_file(path), mode.generate_comm_debug_tracing_table(0));
    std::remove(path.c_str());
  });
}

TEST(CommDebugModules, TrivialOpsShowOnlyAtNoiseLevelThree) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    CommDebugMode mode;
    const DTensor x = DTensor::from_local(ones({2, 3}), mesh, {Replicate{}});
    const DTensor y = add(reshape(x, {3, 2}), Scalar(1.0));
    EXPECT_EQ(y.shape(), Shape({3, 2}));
    const std::string two = mode.generate_comm_debug_tracing_table(2),
                      three = mode.generate_comm_debug_tracing_table(3);
    EXPECT_EQ(two.find("**reshape"), std::string::npos) << two;
    EXPECT_NE(three.find("**reshape"), std::string::npos) << three;
    EXPECT_NE(two.find("**add"), std::string::npos) << two;
  });
}

TEST(CommDebugModules, JsonDumpIsPyTorchsTree) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const Outer model(mesh);
    CommDebugMode mode;
    run_outer(model, mesh);
    const std::string path = temp_path("comm_mode_log.json");
    mode.generate_json_dump(path, 1);
    const nlohmann::json root = nlohmann::json::parse(read_file(path));
    EXPECT_EQ(root["fqn"], "Global");
    EXPECT_EQ(root["collectives_forward"], nlohmann::json::parse(R"j([["all_gather", 1]])j"));
    EXPECT_EQ(root["collectives_backward"], nlohmann::json::parse(R"j([["all_gather", 1]])j"));
    ASSERT_EQ(root["children"].size(), 1u);
    const nlohmann::json& outer = root["children"][0];
    EXPECT_EQ(outer["fqn"], "Outer");
    EXPECT_EQ(outer["module_type"], "Outer");
    EXPECT_EQ(outer["parameters"], nlohmann::json::parse(R"j([["w", "(S(0))"]])j"));
    ASSERT_EQ(outer["children"].size(), 1u);
    const nlohmann::json& inner = outer["children"][0];
    EXPECT_EQ(inner["fqn"], "Outer.inner");
    EXPECT_EQ(inner["collectives_backward"], nlohmann::json::array());
    ASSERT_EQ(inner["operations_forward"].size(), 1u);
    EXPECT_EQ(inner["operations_forward"][0]["name"], "add");
    EXPECT_EQ(inner["operations_forward"][0]["input_sharding"], nlohmann::json::parse(R"j(["(R)", "(R)"])j"));

    // Level 0: the calls only.
    mode.generate_json_dump(path, 0);
    const nlohmann::json quiet = nlohmann::json::parse(read_file(path));
    EXPECT_EQ(quiet["children"][0]["module_type"], "");
    EXPECT_EQ(quiet["children"][0]["parameters"], nlohmann::json::array());
    EXPECT_EQ(quiet["children"][0]["children"][0]["operations_forward"], nlohmann::json::array());
    EXPECT_EQ(quiet["children"][0]["collectives_forward"], nlohmann::json::parse(R"j([["all_gather", 1]])j"));
    std::remove(path.c_str());
  });
}

TEST(CommDebugModules, BuiltInLayersUnderTensorParallelism) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"tp"});
    nn::MLP mlp(mesh, 8, 16);
    nn::parallelize_module(mlp, "tp", {{"fc1", nn::ColwiseParallel{}}, {"fc2", nn::RowwiseParallel{}}});
    CommDebugMode mode;
    const DTensor x = DTensor::from_local(ones({4, 8}), mesh, {Replicate{}});
    const DTensor y = mlp.forward(x);
    EXPECT_EQ(y.placements(), Placements({Replicate{}}));
    // Megatron's one all_reduce, the row-parallel fc2's; the column-parallel fc1 calls nothing.
    const Counts one_reduce{{CollectiveKind::all_reduce, 1}};
    const auto& counts = mode.comm_module_counts();
    EXPECT_EQ(counts.at("Global").forward, one_reduce);
    EXPECT_EQ(counts.at("MLP").forward, one_reduce);
    EXPECT_EQ(counts.at("MLP.fc2").forward, one_reduce);
    EXPECT_FALSE(counts.count("MLP.fc1"));
    EXPECT_EQ(mode.get_sharding_info(), (std::map<std::string, Placements>{{"MLP.fc1.weight", {Shard{0}}},
                                                                           {"MLP.fc1.bias", {Shard{0}}},
                                                                           {"MLP.fc2.weight", {Shard{1}}},
                                                                           {"MLP.fc2.bias", {Replicate{}}}}));
  });
}

TEST(CommDebugModules, AThrowInForwardLeavesTheModule) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const Failing failing(mesh);
    CommDebugMode mode;
    const DTensor x = DTensor::from_local(ones({2}), mesh, {Shard{0}});
    EXPECT_THROW(failing.forward(x), std::runtime_error);
    world().barrier();  // after the throw: Global's alone
    EXPECT_EQ(mode.comm_module_counts().at("Failing").forward, one_gather);
    EXPECT_EQ(mode.comm_module_counts().at("Global").forward,
              (Counts{{CollectiveKind::all_gather, 1}, {CollectiveKind::barrier, 1}}));
  });
}

TEST(CommDebugModules, ModulesAreTrackedOnlyWhileAScopeIsOpen) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const Outer model(mesh);
    run_outer(model, mesh);  // no scope: nothing kept
    CommDebugMode mode;
    world().barrier();
    EXPECT_EQ(mode.comm_module_counts().size(), 1u);
    EXPECT_TRUE(mode.module_operations().empty());
  });
}

TEST(CommDebugModules, ErrorsNameTheCall) {
  for_each_world({1}, [] {
    CommDebugMode mode;
    EXPECT_TRUE(value_error([&] { (void)mode.generate_comm_debug_tracing_table(4); },
                            {"[CommDebugMode::generate_comm_debug_tracing_table] noise_level 4", "0-3"}));
    const std::string never = temp_path("never.json");
    EXPECT_TRUE(value_error([&] { mode.generate_json_dump(never, -1); },
                            {"[CommDebugMode::generate_json_dump] noise_level -1"}));
    EXPECT_FALSE(std::filesystem::exists(never));
    EXPECT_TRUE(throws_with<Error>([&] { mode.generate_json_dump("/nonexistent-dir/comm.json"); },
                                   {"[CommDebugMode::generate_json_dump] cannot open '/nonexistent-dir/comm.json'"}));
    EXPECT_TRUE(throws_with<Error>([&] { mode.log_comm_debug_tracing_table_to_file("/nonexistent-dir/comm.txt"); },
                                   {"[CommDebugMode::log_comm_debug_tracing_table_to_file] cannot open"}));
  });
}
