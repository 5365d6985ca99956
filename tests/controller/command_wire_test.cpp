// The controller's protocol on the wire: every kind of command, with every kind of op argument,
// decodes to what was encoded; so do replies. A truncated or foreign message is a CommError,
// never a wrong command.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <tessera/controller/detail/command.hpp>
#include <tessera/controller/detail/wire.hpp>
#include <tessera/core/error.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::controller::detail;
using tessera::testing::throws_with;

namespace {

// One value of every op argument kind, each field set away from its default.
std::vector<OpArgs> every_op_args() {
  return {NoArgs{},
          ScalarArgs{-2.5},
          DimArgs{{1, -1}},
          ShapeArgs{Shape{4, 0, 7}},
          PlacementArgs{{Shard{1}, Replicate{}, Partial{ReduceOp::max}}},
          ReduceArgs{{0, 2}, true},
          MeshReduceArgs{MeshReduction::avg, true, {1, 0}},
          FactoryArgs{Shape{3, 5}, {Replicate{}, Shard{0}}, DType::bf16, 0.125},
          ListArgs{{0.5, -1e-5}, {3, -100, 0}, Shape{2, 8}, "bij,bjk->bik"}};
}

// One command of every kind, each field set away from its default (strings over several words,
// an empty one, a map of several entries).
std::vector<Command> every_command() {
  std::vector<Command> commands{
      Stop{},
      MakeMesh{3, {2, 2}, {"dp", "a rather long axis name"}, {1, 2, 3, 4}},
      SliceMesh{4, 3, {{"dp", 1}, {"tp", 0}}},
      MakeStream{2},
      CallRemote{1, 2, "train step", {7, 8}, {9, 10, 11}, {21, 22, 23}, {{3, 1, 2, 5}, {}, {0}}},
      Seed{1, 0, 0xFFFFFFFFFFFFFFF1ull, {0, 2}},
      Fetch{1, 2, 7, true, 99},
      QueryLayout{1, 0, 7, 100},
      Drop{1, 3, 7},
      Signal{1, 5},
      Wait{2, 5},
      ToMesh{4, 3, 5, 2, 17, 18, 77},
  };
  for (const OpArgs& args : every_op_args()) commands.push_back(RunOp{1, 2, "mesh_reduce", {5, 6}, args, 12, 4, 31});
  commands.push_back(RunOp{0, 0, "", {}, NoArgs{}, 0, -1, 0});
  return commands;
}

}  // namespace

TEST(CommandWire, EveryCommandRoundTrips) {
  const std::vector<Command> commands = every_command();
  // Every kind is covered, and every op argument kind.
  std::vector<bool> kinds(std::variant_size_v<Command>, false);
  for (const Command& c : commands) kinds[c.index()] = true;
  for (size_t k = 0; k < kinds.size(); ++k) EXPECT_TRUE(kinds[k]) << "no command of kind " << k;
  EXPECT_EQ(every_op_args().size(), std::variant_size_v<OpArgs>);

  for (const Command& c : commands) {
    const std::vector<int64_t> words = encode_command(c);
    const Command back = decode_command(words);
    EXPECT_TRUE(back == c) << kind_name(c);
    EXPECT_EQ(stream_of(back), stream_of(c));
    EXPECT_EQ(request_of(back), request_of(c));
  }
  EXPECT_EQ(request_of(Command(Fetch{1, 2, 7, true, 99})), 99u);
  EXPECT_EQ(stream_of(Command(Wait{2, 5})), 2);
  EXPECT_EQ(std::string(kind_name(Command(CallRemote{}))), "call_remote");
}

TEST(CommandWire, TruncatedOrForeignMessagesAreCommErrors) {
  for (const Command& c : every_command()) {
    const std::vector<int64_t> words = encode_command(c);
    for (size_t n = 0; n < words.size(); ++n) {
      const std::vector<int64_t> cut(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(n));
      EXPECT_THROW(decode_command(cut), CommError) << kind_name(c) << " cut to " << n << " of " << words.size();
    }
  }
  // An unknown kind, and a count larger than the message.
  EXPECT_TRUE(throws_with<CommError>([] { decode_command({99}); }, {"[controller]", "alternative 99"}));
  EXPECT_TRUE(throws_with<CommError>([] { decode_command({1, 0, 1LL << 40}); }, {"[controller]", "items"}));
  // A mesh reduce by mesh reduction 9: there is none.
  std::vector<int64_t> words =
      encode_command(RunOp{1, 0, "", {}, MeshReduceArgs{MeshReduction::max, false, {0}}, 2, -1, 0});
  const auto at = std::find(words.begin(), words.end(), static_cast<int64_t>(MeshReduction::max));
  ASSERT_NE(at, words.end());
  *at = 9;
  EXPECT_TRUE(throws_with<CommError>([&] { decode_command(words); }, {"[controller]", "mesh reduction 9"}));
}

TEST(CommandWire, RepliesRoundTrip) {
  Reply tensor;
  tensor.dtype = DType::i64;
  tensor.shape = Shape{2, 3};
  Reply layout;
  layout.is_tensor = false;
  layout.layout_words = {1, 2, 3, -4};
  Reply error;
  error.ok = false;
  error.error = "worker rank 3: [matmul] shapes [3, 4] and [3, 4] do not chain";
  for (const Reply& reply : {tensor, layout, error}) EXPECT_TRUE(decode_reply(encode_reply(reply)) == reply);
}
