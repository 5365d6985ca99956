// Checkpoints as Zarr v3 groups: a map of DTensors saved in one set of layouts loads into any
// other (uneven pieces, nested and Partial layouts, every dtype, 0-d and empty tensors), every
// chunk written once; a save that fails on one rank leaves the previous checkpoint intact; load
// names a corrupt, short or missing chunk, and a missing or mismatched array, on every rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <tessera/checkpoint/checkpoint.hpp>
#include <tessera/checkpoint/detail/chunks.hpp>
#include <tessera/checkpoint/detail/faults.hpp>
#include <tessera/checkpoint/detail/zarr.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "checkpoint/checkpoint_test_util.hpp"
#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string key;
  Tensor whole;
};

std::vector<Case> cases() {
  return {{"a_f64", sample_values({7, 5}, 0.1, DType::f64)}, {"b_f32", sample_values({6}, 0.2, DType::f32)},
          {"c_bf16", sample_values({5, 3}, 0.3, DType::bf16)}, {"d_i64", sample_values({4}, 0.4, DType::i64)},
          {"e_b8", sample_values({3, 2}, 0.5, DType::b8)},     {"f_f16", sample_values({2, 9}, 0.6, DType::f16)},
          {"g_scalar", sample_values({}, 0.7, DType::f32)},    {"h_empty", sample_values({0, 3}, 0.8, DType::f32)},
          {"i_u8", sample_values({5}, 0.9, DType::u8)},        {"j_i32", sample_values({3, 3}, 1.0, DType::i32)}};
}

}  // namespace

TEST(Checkpoint, RoundTripsAcrossLayoutsAndMeshes) {
  for_each_world({2, 3, 4, 6}, [] {
    const int n = world_size();
    const bool two_d = n % 2 == 0 && n > 2;
    const DeviceMesh save_mesh = two_d ? DeviceMesh({2, n / 2}, {"dp", "tp"}) : DeviceMesh({n}, {"dp"});
    const std::string dir = shared_dir("checkpoint-round-trip");
    // Saved in a variety of layouts: sharded both ways, nested on one dim, Partial, replicated.
    std::map<std::string, DTensor> saved;
    size_t k = 0;
    for (const Case& c : cases()) {
      Placements p(static_cast<size_t>(save_mesh.ndim()), Replicate{});
      if (c.whole.ndim() >= 1 && k % 3 == 0) p[0] = Shard{0};
      if (c.whole.ndim() >= 2 && two_d && k % 3 == 0) p[1] = Shard{1};
      if (c.whole.ndim() >= 1 && two_d && k % 3 == 1) p[0] = Shard{0}, p[1] = Shard{0};  // nested
      DTensor t = distribute_tensor(c.whole, save_mesh, p);
      if (k == 1) {  // Partial: the saved value is the sum
        FromLocalOptions shape;
        shape.shape = c.whole.shape();
        Placements partial(static_cast<size_t>(save_mesh.ndim()), Replicate{});
        partial[0] = Partial{};
        t = DTensor::from_local(div(c.whole, Scalar(static_cast<double>(save_mesh.size(0)))), save_mesh, partial, shape);
      }
      saved.emplace(c.key, t);
      ++k;
    }
    for (const int zstd_level : {0, 3}) {  // raw chunks, then zstd-compressed ones
      SCOPED_TRACE(::testing::Message() << "zstd_level " << zstd_level);
      checkpoint::SaveOptions options;
      options.zstd_level = zstd_level;
      checkpoint::save(dir, saved, options);
      EXPECT_TRUE(fs::exists(fs::path(dir) / "zarr.json"));
      EXPECT_FALSE(fs::exists(dir + ".tessera-saving"));
      // a_f64 [7, 5], saved (Shard(0), Shard(1)): each chunk written once, no more.
      world().barrier();
      int64_t files = 0;
      for (const auto& entry : fs::directory_iterator(fs::path(dir) / "a_f64"))  // chunks "c.i.j" beside zarr.json
        files += entry.path().filename().string().rfind("c.", 0) == 0 ? 1 : 0;
      // Chunks of ceil(L / k) along a dim cut k ways: ceil(L / chunk) of them.
      const auto grid = [](int64_t extent, int64_t k) {
        const int64_t chunk = (extent + k - 1) / k;
        return (extent + chunk - 1) / chunk;
      };
      EXPECT_EQ(files, two_d ? grid(7, 2) * grid(5, n / 2) : grid(7, n));

      // Loaded into other layouts on a 1-d mesh of every rank, then replicated.
      const DeviceMesh load_mesh({n}, {"x"});
      for (int variant = 0; variant < 2; ++variant) {
        std::map<std::string, DTensor> loaded;
        for (const Case& c : cases()) {
          const Placements p = variant == 0 && c.whole.ndim() >= 1 ? Placements{Shard{c.whole.ndim() - 1}} : Placements{Replicate{}};
          loaded.emplace(c.key, distribute_tensor(zeros(c.whole.shape(), c.whole.dtype()), load_mesh, p));
        }
        checkpoint::load(dir, loaded);
        for (const Case& c : cases())
          EXPECT_TRUE(allclose(loaded.at(c.key).full_tensor().to(DType::f64), c.whole.to(DType::f64), 1e-6, 0))
              << c.key << " variant " << variant;
      }
    }
    remove_shared(dir);
  });
}

// A rank fails mid-save (after its first array): every rank throws naming it, and the previous
// checkpoint still loads, unchanged; nothing is left beside it.
TEST(Checkpoint, AFailedSaveLeavesThePreviousCheckpoint) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const std::string dir = shared_dir("checkpoint-atomic");
    const Tensor first = sample_values({8, 3}, 0.1, DType::f32), second = sample_values({8, 3}, 2.0, DType::f32);
    checkpoint::save(dir, {{"w", distribute_tensor(first, mesh, {Shard{0}})}, {"v", distribute_tensor(first, mesh, {Shard{1}})}});
    if (rank() == 1) checkpoint::detail::set_save_fault(1);
    EXPECT_TRUE(throws_with<checkpoint::IoError>(
        [&] {
          checkpoint::save(dir, {{"w", distribute_tensor(second, mesh, {Shard{0}})}, {"v", distribute_tensor(second, mesh, {Shard{1}})}});
        },
        {"[checkpoint::save]", "rank 1 failed", "fault injected", "is unchanged"}));
    checkpoint::detail::set_save_fault(-1);
    std::map<std::string, DTensor> loaded{{"w", distribute_tensor(zeros({8, 3}), mesh, {Replicate{}})},
                                          {"v", distribute_tensor(zeros({8, 3}), mesh, {Shard{0}})}};
    checkpoint::load(dir, loaded);
    EXPECT_TRUE(allclose(loaded.at("w").full_tensor(), first, 0, 0));
    EXPECT_TRUE(allclose(loaded.at("v").full_tensor(), first, 0, 0));
    EXPECT_FALSE(fs::exists(dir + ".tessera-saving"));
    remove_shared(dir);
  });
}

// zstd chunks: smaller files for compressible data, the codec in the metadata, checked by CRC-32
// like raw ones; a chunk that does not decompress to a whole chunk is named.
TEST(Checkpoint, ZstdChunksAreCompressedAndChecked) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const std::string dir = shared_dir("checkpoint-zstd");
    const Tensor w = full({64, 32}, Scalar(1.5), DType::f32);
    checkpoint::SaveOptions options;
    options.zstd_level = 5;
    checkpoint::save(dir, {{"w", distribute_tensor(w, mesh, {Shard{0}})}}, options);
    const fs::path chunk = fs::path(dir) / "w" / "c.0.0";
    world().barrier();
    EXPECT_LT(static_cast<int64_t>(fs::file_size(chunk)), 64 * 32 * 4 / world_size() / 10);
    std::ifstream meta(fs::path(dir) / "w" / "zarr.json");
    const std::string text((std::istreambuf_iterator<char>(meta)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\"zstd\""), std::string::npos) << text;
    std::map<std::string, DTensor> loaded{{"w", distribute_tensor(zeros({64, 32}), mesh, {Shard{1}})}};
    checkpoint::load(dir, loaded);
    EXPECT_TRUE(allclose(loaded.at("w").full_tensor(), w, 0, 0));

    world().barrier();
    if (rank() == 0) {  // a valid frame of the wrong size, with its CRC-32 made to match in the metadata
      const std::vector<char> frame = checkpoint::detail::zstd_compress("abc", 3, 1);
      std::ofstream(chunk, std::ios::binary | std::ios::trunc).write(frame.data(), static_cast<std::streamsize>(frame.size()));
      std::string fixed = text;
      const std::string crc_key = "\"c.0.0\": ";
      const size_t at = fixed.find(crc_key) + crc_key.size();
      fixed.replace(at, fixed.find_first_of(",\n}", at) - at,
                    std::to_string(checkpoint::detail::crc32_of(frame.data(), static_cast<int64_t>(frame.size()))));
      std::ofstream(fs::path(dir) / "w" / "zarr.json", std::ios::trunc) << fixed;
    }
    world().barrier();
    EXPECT_TRUE(throws_with<checkpoint::IoError>([&] { checkpoint::load(dir, loaded); },
                                                 {"[checkpoint::load]", chunk.string(), "does not decompress"}));
    options.zstd_level = 23;
    EXPECT_TRUE(throws_with<ValueError>([&] { checkpoint::save(dir, {{"w", distribute_tensor(w, mesh, {Shard{0}})}}, options); },
                                        {"[checkpoint::save]", "zstd_level 23"}));
    remove_shared(dir);
  });
}

TEST(Checkpoint, LoadNamesWhatIsWrong) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const std::string dir = shared_dir("checkpoint-errors");
    const Tensor w = sample_values({6, 4}, 0.3, DType::f64);
    checkpoint::save(dir, {{"w", distribute_tensor(w, mesh, {Shard{0}})}});
    const auto into = [&] { return std::map<std::string, DTensor>{{"w", distribute_tensor(zeros({6, 4}, DType::f64), mesh, {Replicate{}})}}; };
    const fs::path chunk = fs::path(dir) / "w" / "c.0.0";

    // One flipped byte: the rank that reads chunk 0 names it, on every rank.
    world().barrier();
    if (rank() == 0) {
      std::fstream f(chunk, std::ios::in | std::ios::out | std::ios::binary);
      char byte = 0;
      f.seekg(3);
      f.read(&byte, 1);
      byte = static_cast<char>(byte ^ 0x20);
      f.seekp(3);
      f.write(&byte, 1);
    }
    world().barrier();
    auto target = into();
    EXPECT_TRUE(throws_with<checkpoint::IoError>([&] { checkpoint::load(dir, target); },
                                                 {"[checkpoint::load]", chunk.string(), "is corrupt"}));
    world().barrier();
    if (rank() == 0) fs::resize_file(chunk, 10);
    world().barrier();
    EXPECT_TRUE(throws_with<checkpoint::IoError>([&] { checkpoint::load(dir, target); },
                                                 {"[checkpoint::load]", chunk.string(), "has 10 bytes"}));
    world().barrier();
    if (rank() == 0) fs::remove(chunk);
    world().barrier();
    EXPECT_TRUE(throws_with<checkpoint::IoError>([&] { checkpoint::load(dir, target); },
                                                 {"[checkpoint::load]", chunk.string(), "is missing"}));

    std::map<std::string, DTensor> missing{{"nope", distribute_tensor(zeros({6, 4}, DType::f64), mesh, {Replicate{}})}};
    EXPECT_TRUE(throws_with<ValueError>([&] { checkpoint::load(dir, missing); }, {"[checkpoint::load]", "no array 'nope'"}));
    std::map<std::string, DTensor> wrong{{"w", distribute_tensor(zeros({6, 5}, DType::f64), mesh, {Replicate{}})}};
    EXPECT_TRUE(throws_with<ValueError>([&] { checkpoint::load(dir, wrong); },
                                        {"[checkpoint::load]", "'w'", "[6, 4] f64", "[6, 5] f64"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { checkpoint::save(dir, {{"a/b", distribute_tensor(w, mesh, {Shard{0}})}}); },
                                        {"[checkpoint::save]", "'a/b'"}));
    remove_shared(dir);
  });
}

// The chunk grid follows the layout: a regular nested split keeps its pieces (chunk = piece,
// index = mixed-radix over the mesh dims), an irregular one is left whole, explicit sizes become
// torch.chunk sizes on the same mesh dim, Partial is reduced.
TEST(Checkpoint, ChunkPlansFollowTheLayout) {
  const MeshSpec mesh(Shape{2, 4}, {"dp", "tp"});
  const auto plan = [&](const Shape& shape, Placements p, ShardSizes sizes = {}) {
    return checkpoint::detail::chunk_plan(Layout(shape, DType::f32, mesh, std::move(p), {}, std::move(sizes)));
  };
  const auto nested = plan({16, 5}, {Shard{0}, Shard{0}});
  EXPECT_EQ(nested.chunks, Shape({2, 5}));
  EXPECT_EQ(nested.cut_by[0], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(*checkpoint::detail::chunk_index(nested, {1, 2}), (std::vector<int64_t>{6, 0}));
  const auto irregular = plan({18, 2}, {Shard{0}, Shard{0}});  // pieces 3 2 3 2 3 2 2 1
  EXPECT_EQ(irregular.chunks, Shape({18, 2}));
  EXPECT_TRUE(irregular.cut_by[0].empty());
  EXPECT_EQ(*checkpoint::detail::chunk_index(irregular, {0, 0}), (std::vector<int64_t>{0, 0}));
  EXPECT_FALSE(checkpoint::detail::chunk_index(irregular, {0, 1}).has_value());  // a replica
  const auto sized = plan({7, 3}, {Replicate{}, Shard{0}}, {{0, {1, 4, 0, 2}}});
  EXPECT_EQ(sized.chunks, Shape({2, 3}));
  EXPECT_FALSE(sized.layout.has_explicit_sizes(0));
  EXPECT_FALSE(checkpoint::detail::chunk_index(sized, {1, 0}).has_value());  // dp replica
  const auto partial = plan({6, 4}, {Partial{}, Shard{1}});
  EXPECT_FALSE(partial.layout.has_partial());
  EXPECT_EQ(partial.chunks, Shape({6, 1}));
}

// Explicit piece sizes (PhysicsNeMo's sharding_shapes, empty pieces too) and a regular nested
// split are saved as one chunk per piece of the even split, each written once, and load back.
TEST(Checkpoint, ExplicitSizesAndNestedSplitsSaveTheirPieces) {
  for_each_world({2, 4, 6}, [] {
    const int n = world_size();
    const std::string dir = shared_dir("checkpoint-pieces");
    const DeviceMesh flat({n}, {"x"});
    const Tensor whole = sample_values({3 * n + 1, 2}, 0.4, DType::f64);
    // Every rank holds 3 rows, except that rank 0 holds none and the last holds the rest.
    std::vector<int64_t> sizes(static_cast<size_t>(n), 3);
    sizes.front() = 0;
    sizes.back() = 3 * n + 1 - 3 * (n - 2);
    int64_t begin = 0;
    for (int r = 0; r < rank(); ++r) begin += sizes[static_cast<size_t>(r)];
    FromLocalOptions uneven;
    uneven.shape = whole.shape();
    uneven.sizes = {{0, sizes}};
    const DTensor explicit_sizes = DTensor::from_local(
        whole.narrow(0, begin, sizes[static_cast<size_t>(rank())]).contiguous(), flat, {Shard{0}}, uneven);
    std::map<std::string, DTensor> saved{{"sized", explicit_sizes}};
    if (n % 2 == 0) {
      const DeviceMesh grid({2, n / 2}, {"dp", "tp"});
      saved.emplace("nested", distribute_tensor(sample_values({2 * n, 3}, 0.9, DType::f32), grid, {Shard{0}, Shard{0}}));
    }
    checkpoint::save(dir, saved);
    world().barrier();
    const auto chunk_files = [&](const std::string& key) {
      int64_t files = 0;
      for (const auto& entry : fs::directory_iterator(fs::path(dir) / key))
        files += entry.path().filename().string().rfind("c.", 0) == 0 ? 1 : 0;
      return files;
    };
    const int64_t chunk = (3 * n + 1 + n - 1) / n;  // torch.chunk over n ranks
    EXPECT_EQ(chunk_files("sized"), (3 * n + 1 + chunk - 1) / chunk);
    if (n % 2 == 0) {
      EXPECT_EQ(chunk_files("nested"), n);  // one per rank: the pieces are regular
    }
    std::map<std::string, DTensor> loaded{{"sized", distribute_tensor(zeros(whole.shape(), DType::f64), flat, {Replicate{}})}};
    if (n % 2 == 0)
      loaded.emplace("nested", distribute_tensor(zeros({2 * n, 3}), flat, {Shard{1}}));
    // and into other explicit sizes: the last rank holds none, rank 0 the rest
    std::vector<int64_t> other(sizes.rbegin(), sizes.rend());
    FromLocalOptions reversed;
    reversed.shape = whole.shape();
    reversed.sizes = {{0, other}};
    std::map<std::string, DTensor> again{
        {"sized", DTensor::from_local(zeros({other[static_cast<size_t>(rank())], 2}, DType::f64), flat, {Shard{0}}, reversed)}};
    checkpoint::load(dir, loaded);
    checkpoint::load(dir, again);
    EXPECT_TRUE(equal(loaded.at("sized").full_tensor(), whole));
    EXPECT_TRUE(equal(again.at("sized").full_tensor(), whole));
    EXPECT_EQ(again.at("sized").to_local().shape()[0], other[static_cast<size_t>(rank())]);
    if (n % 2 == 0) {
      EXPECT_TRUE(equal(loaded.at("nested").full_tensor(), sample_values({2 * n, 3}, 0.9, DType::f32)));
    }
    remove_shared(dir);
  });
}
