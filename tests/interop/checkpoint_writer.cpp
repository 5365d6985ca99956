// checkpoint_writer <out>: what tests/interop/check_checkpoint.py reads back with zarr-python and
// the safetensors package (run_interop.sh runs both). On 4 in-process ranks, a 2 x 2 mesh, it
// saves arrays of every dtype in sharded, uneven, nested and Partial layouts as a Zarr group
// (<out>/zarr), exports some of them as safetensors in one file (<out>/st) and split
// (<out>/st-split), and lists what it wrote in <out>/manifest.json, so that the checker knows
// each array's shape, dtype and phase without a second copy of this table.
//
// Values: v[i] = sin(0.61 * i + phase) in f64 over the row-major flat index i, then converted as
// Tensor::to converts: f32 rounded to nearest even; f16 and bf16 through f32 (each rounding to
// nearest even); ints trunc((v + 1) * 50); bool v > 0. Tessera's ops compute it (as
// checkpoint_test.cpp's values()): one kernel per operation, so no multiply-add is fused and the
// checker's float64 arithmetic gives the same bits.
#include <cstdio>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <tessera/tessera.hpp>

namespace {

using namespace tessera;

struct Array {
  std::string name;
  Shape shape;
  DType dtype;
  double phase;
  Placements placements;  // on the mesh (dp, tp); Partial: dp = 0 holds the value, the others 0
  bool safetensors;       // also exported as safetensors
};

std::vector<Array> arrays() {
  const Placement r = Replicate{}, s0 = Shard{0}, s1 = Shard{1}, s2 = Shard{2}, p = Partial{};
  return {
      {"f64_s0_s1", {7, 5}, DType::f64, 0.1, {s0, s1}, true},       // uneven both ways
      {"f32_s1_r", {6, 9}, DType::f32, 0.2, {s1, r}, true},
      {"f16_nested", {11}, DType::f16, 0.3, {s0, s0}, true},        // one dim split by both mesh dims
      {"bf16_r_s0", {5, 3}, DType::bf16, 0.4, {r, s0}, true},
      {"i64_s0", {9}, DType::i64, 0.5, {s0, r}, true},
      {"i32_s1_s0", {4, 7}, DType::i32, 0.6, {s1, s0}, true},
      {"u8_r", {3, 3}, DType::u8, 0.7, {r, r}, true},
      {"b8_s0_s1", {5, 3}, DType::b8, 0.8, {s0, s1}, true},
      {"f32_scalar", {}, DType::f32, 0.9, {r, r}, true},             // 0-d
      {"f32_empty", {0, 4}, DType::f32, 1.0, {s0, r}, true},         // no elements
      {"f64_3d", {3, 4, 5}, DType::f64, 1.1, {s2, s0}, false},
      {"f32_partial", {6, 2}, DType::f32, 1.2, {p, s1}, false},
  };
}

Tensor values(const Shape& shape, double phase, DType dtype) {
  const Tensor x = sin(add(mul(arange(shape.numel()).to(DType::f64), Scalar(0.61)), Scalar(phase))).reshape(shape);
  if (dtype == DType::b8) return gt(x, Scalar(0.0));
  if (dtype == DType::i64 || dtype == DType::i32 || dtype == DType::u8) return mul(add(x, Scalar(1.0)), Scalar(50.0)).to(dtype);
  return x.to(dtype);
}

// Small enough that the split export has several files, one of them a single tensor larger than it.
constexpr int64_t kMaxFileBytes = 100;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output directory>\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  try {
    launch(4, [&] {  // the 2 x 2 mesh needs exactly 4 ranks
      const DeviceMesh mesh({2, 2}, {"dp", "tp"});
      std::map<std::string, DTensor> zarr, safetensors;
      checkpoint::SafetensorsOptions one_file;
      one_file.metadata = {{"format", "np"}, {"writer", "tessera checkpoint_writer"}};
      checkpoint::SafetensorsOptions split = one_file;
      split.max_file_bytes = kMaxFileBytes;
      nlohmann::json manifest{{"zarr", nlohmann::json::array()},
                              {"safetensors", nlohmann::json::array()},
                              {"metadata", one_file.metadata},
                              {"max_file_bytes", kMaxFileBytes}};
      for (const Array& a : arrays()) {
        const Tensor whole = values(a.shape, a.phase, a.dtype);
        DTensor t;
        if (is_partial(a.placements[0])) {
          FromLocalOptions shape;
          shape.shape = a.shape;
          const Placements local_placements{Replicate{}, a.placements[1]};
          const Tensor local = distribute_tensor(whole, mesh, local_placements).to_local();
          t = DTensor::from_local(mesh.coordinate("dp") == 0 ? local : zeros_like(local), mesh, a.placements, shape);
        } else {
          t = distribute_tensor(whole, mesh, a.placements);
        }
        zarr.emplace(a.name, t);
        if (a.safetensors) safetensors.emplace(a.name, t);
        manifest["zarr"].push_back({{"name", a.name},
                                    {"shape", a.shape.vec()},
                                    {"dtype", std::string(name(a.dtype))},
                                    {"phase", a.phase},
                                    {"layout", t.layout().to_string()}});
        if (a.safetensors) manifest["safetensors"].push_back(a.name);
      }
      checkpoint::save(out + "/zarr", zarr);
      checkpoint::SaveOptions compressed;  // the same arrays, zstd chunks (Zarr's zstd codec)
      compressed.zstd_level = 3;
      checkpoint::save(out + "/zarr-zstd", zarr, compressed);
      checkpoint::export_safetensors(out + "/st", safetensors, one_file);
      checkpoint::export_safetensors(out + "/st-split", safetensors, split);
      if (rank() == 0) {
        std::ofstream file(out + "/manifest.json");
        file << manifest.dump(2) << "\n";
        file.close();
        if (!file) throw std::runtime_error("cannot write " + out + "/manifest.json");
        std::printf("checkpoint_writer: %zu arrays in %s/zarr, %zu in %s/st and %s/st-split\n", zarr.size(),
                    out.c_str(), safetensors.size(), out.c_str(), out.c_str());
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_writer: %s\n", e.what());
    return 1;
  }
  return 0;
}
