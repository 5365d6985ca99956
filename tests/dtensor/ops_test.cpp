// Sharded op equivalence: for every op, every input placement combination (R, S(d) for each dim,
// P(sum)) on the meshes [4], 2x2 and 2x3, with even and uneven shapes (empty shards included),
// the result's full_tensor() equals the Tensor op on the unsharded inputs.
//
// Each op case is one value-parameterized test, named after its canonical text (op, arguments,
// input shapes), e.g. Reductions/ShardedOp.MatchesTheUnshardedOp/sum_dims_0_keepdim_5x3: a
// failure names its case and the other cases still run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/dispatch.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/ops/ops.hpp>

#include "placement_sweep.hpp"
#include "sharded_inputs.hpp"
#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

struct Case {
  std::vector<Shape> shapes;
  bool partial = true;       // include P(sum) inputs
  bool positive = false;     // data in [1, 23]
  size_t max_combos = 4096;  // above this, every k-th combination (deterministic) is run
  double tolerance = 1e-4;
  // Per input: explicit data (integer indices) instead of data(). Built with the case list, before
  // any rank starts: plain local Tensors only (read, never written, by the ranks).
  std::vector<Tensor> given = {};
};

using DOp = std::function<DTensor(const std::vector<DTensor>&)>;
using LOp = std::function<Tensor(const std::vector<Tensor>&)>;

std::string describe(const std::vector<Placements>& combo) {
  std::string text;
  for (const auto& p : combo) text.append(text.empty() ? "" : " ").append(to_string(p));
  return text;
}

// Runs `dop` on every placement combination of the inputs and compares with `lop` on the globals.
void check_op(const std::string& name, const Case& c, const DOp& dop, const LOp& lop) {
  for (const auto& mesh_shape : sweep_meshes(world_size())) {
    const DeviceMesh mesh = sweep_mesh(mesh_shape);
    std::vector<Tensor> globals;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      const bool given = i < c.given.size() && c.given[i].defined();
      globals.push_back(given ? c.given[i] : data(c.shapes[i], static_cast<int>(i), c.positive));
    }
    const Tensor expected = lop(globals);
    std::vector<std::vector<Placements>> options;
    size_t combos = 1;
    for (size_t i = 0; i < globals.size(); ++i) {
      const bool partial_ok = c.partial && is_floating(globals[i].dtype());
      options.push_back(placement_combinations(globals[i].ndim(), mesh.ndim(), partial_ok));
      combos *= options.back().size();
    }
    // Sanitizer builds run a deterministic sample; the Release run covers every combination.
    const size_t limit = sample_limit(c.max_combos);
    const size_t stride = (combos + limit - 1) / limit;
    for (size_t index = 0; index < combos; index += stride) {
      std::vector<Placements> combo;
      std::vector<DTensor> inputs;
      for (size_t i = 0, rest = index; i < globals.size(); ++i, rest /= options[i - 1].size()) {
        combo.push_back(options[i][rest % options[i].size()]);
        inputs.push_back(make_input(globals[i], mesh, combo.back()));
      }
      const DTensor out = dop(inputs);
      const Tensor got = out.full_tensor();
      const bool ok = got.shape() == expected.shape() && got.dtype() == expected.dtype() &&
                      allclose(got.to(DType::f64), expected.to(DType::f64), c.tolerance, c.tolerance, true);
      EXPECT_TRUE(ok) << name << " on mesh " << mesh.to_string() << " with inputs " << describe(combo) << " -> "
                      << out.layout().to_string() << " (rank " << rank() << ")\ngot " << got << "\nexpected "
                      << expected;
      if (!ok) break;  // one report per case and mesh, not one per combination
    }
  }
}

const std::vector<int> kWorlds = {4, 6};

// --- the parameterized sweep --------------------------------------------------------------------

// One sweep: `name` (the op and the arguments that tell it apart from its neighbours) checked by
// check_op on `c`. Lambdas hold their arguments by value: a case outlives the loop that made it.
struct OpCase {
  std::string name;
  Case c;
  DOp dop;
  LOp lop;
};

// What gtest prints for a parameter (instead of the bytes of the struct).
void PrintTo(const OpCase& p, std::ostream* os) {
  *os << p.name;
  for (const Shape& s : p.c.shapes) *os << ' ' << s.to_string();
}

// Shape::to_string() "[5, 3]" as "5x3"; a 0-d shape as "scalar".
std::string shape_text(const Shape& shape) {
  std::ostringstream text;
  for (const char ch : shape.to_string())
    if (ch == ',') text << 'x';
    else if (ch != '[' && ch != ']' && ch != ' ') text << ch;
  return shape.empty() ? "scalar" : text.str();
}

// Every run of characters outside [A-Za-z0-9] becomes one '_', none at either end; a minus sign
// (a '-' that starts a word, as in "dim -1" or "-inf") becomes "neg", so that "dim -1" and
// "dim 1" stay apart.
std::string identifier(const std::string& text) {
  const auto alnum = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) != 0; };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (alnum(ch)) {
      out += ch;
    } else if (ch == '-' && (i == 0 || !alnum(text[i - 1])) && i + 1 < text.size() && alnum(text[i + 1])) {
      if (!out.empty() && out.back() != '_') out += '_';
      out += "neg";
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

// The test name of a case: its name and input shapes, e.g. "sum dims [0] keepdim" on [5, 3] ->
// sum_dims_0_keepdim_5x3. Names are made distinct by the case lists; should two still meet in
// one instantiation, the later ones get _2, _3 (gtest names the parameters of one instantiation
// in index order, starting from 0).
std::string case_name(const ::testing::TestParamInfo<OpCase>& info) {
  std::ostringstream text;
  text << info.param.name;
  for (const Shape& s : info.param.c.shapes) text << ' ' << shape_text(s);
  std::string name = identifier(text.str());
  static std::map<std::string, int> seen;
  if (info.index == 0) seen.clear();
  if (const int n = ++seen[name]; n > 1) name += "_" + std::to_string(n);
  return name;
}

class ShardedOp : public ::testing::TestWithParam<OpCase> {};

TEST_P(ShardedOp, MatchesTheUnshardedOp) {
  const OpCase& p = GetParam();
  for_each_world(kWorlds, [&] { check_op(p.name, p.c, p.dop, p.lop); });
}

// The former check_binary / check_unary: one case per shape.
void add_binary(std::vector<OpCase>& out, const std::string& name, const DOp& dop, const LOp& lop,
                size_t max_combos = 4096) {
  for (const auto& shapes : std::vector<std::vector<Shape>>{{{5, 3}, {5, 3}}, {{4, 6}, {6}}, {{1, 3}, {5, 1}}})
    out.push_back({name, Case{shapes, true, false, max_combos}, dop, lop});
}

void add_unary(std::vector<OpCase>& out, const std::string& name, const DOp& dop, const LOp& lop,
               bool positive = false) {
  for (const auto& shape : {Shape{5, 3}, Shape{4, 6}, Shape{2, 1}}) out.push_back({name, Case{{shape}, true, positive}, dop, lop});
}

std::string dim_text(std::optional<int64_t> dim) { return dim ? " dim " + std::to_string(*dim) : " dim none"; }

std::string dims_text(const std::vector<int64_t>& dims) {
  return dims.empty() ? std::string(" all dims") : " dims " + Shape(dims).to_string();
}

std::string reduction_text(Reduction r) {
  switch (r) {
    case Reduction::none: return "none";
    case Reduction::mean: return "mean";
    case Reduction::sum: return "sum";
  }
  return "?";
}

Tensor indices(const Shape& shape, int64_t count, std::optional<int64_t> ignored = std::nullopt) {
  std::vector<int64_t> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i * 5 + 3) % count;
  if (ignored && !v.empty()) v[1 % v.size()] = *ignored;
  return from_vector(v, shape);
}

// --- case lists, one per instantiation ----------------------------------------------------------

std::vector<OpCase> arithmetic_cases() {
  std::vector<OpCase> out;
  add_binary(out, "add", [](auto& x) { return x[0] + x[1]; }, [](auto& x) { return x[0] + x[1]; });
  add_binary(out, "sub", [](auto& x) { return x[0] - x[1]; }, [](auto& x) { return x[0] - x[1]; });
  add_binary(out, "mul", [](auto& x) { return x[0] * x[1]; }, [](auto& x) { return x[0] * x[1]; });
  add_binary(out, "div", [](auto& x) { return div(x[0], add(abs(x[1]), 1.0)); },
             [](auto& x) { return div(x[0], add(abs(x[1]), 1.0)); });
  add_binary(out, "maximum", [](auto& x) { return maximum(x[0], x[1]); }, [](auto& x) { return maximum(x[0], x[1]); });
  add_binary(out, "minimum", [](auto& x) { return minimum(x[0], x[1]); }, [](auto& x) { return minimum(x[0], x[1]); });
  return out;
}

std::vector<OpCase> pow_comparison_logical_cases() {
  std::vector<OpCase> out;
  add_binary(out, "pow", [](auto& x) { return pow(x[0], abs(x[1])); }, [](auto& x) { return pow(x[0], abs(x[1])); }, 64);
  add_binary(out, "eq", [](auto& x) { return eq(x[0], x[1]); }, [](auto& x) { return eq(x[0], x[1]); }, 64);
  add_binary(out, "ne", [](auto& x) { return ne(x[0], x[1]); }, [](auto& x) { return ne(x[0], x[1]); }, 64);
  add_binary(out, "lt", [](auto& x) { return lt(x[0], x[1]); }, [](auto& x) { return lt(x[0], x[1]); }, 64);
  add_binary(out, "le", [](auto& x) { return le(x[0], x[1]); }, [](auto& x) { return le(x[0], x[1]); }, 64);
  add_binary(out, "gt", [](auto& x) { return gt(x[0], x[1]); }, [](auto& x) { return gt(x[0], x[1]); }, 64);
  add_binary(out, "ge", [](auto& x) { return ge(x[0], x[1]); }, [](auto& x) { return ge(x[0], x[1]); }, 64);
  add_binary(out, "logical_and", [](auto& x) { return logical_and(gt(x[0], 0.0), gt(x[1], 0.0)); },
             [](auto& x) { return logical_and(gt(x[0], 0.0), gt(x[1], 0.0)); }, 64);
  add_binary(out, "logical_or", [](auto& x) { return logical_or(gt(x[0], 0.0), gt(x[1], 0.0)); },
             [](auto& x) { return logical_or(gt(x[0], 0.0), gt(x[1], 0.0)); }, 64);
  return out;
}

// A scalar beside a Partial(sum) is added once, not once per rank (PyTorch DTensor's known bug).
std::vector<OpCase> scalar_operand_cases() {
  std::vector<OpCase> out;
  add_unary(out, "x + 2.5", [](auto& x) { return x[0] + 2.5; }, [](auto& x) { return x[0] + 2.5; });
  add_unary(out, "3 - x", [](auto& x) { return 3 - x[0]; }, [](auto& x) { return 3 - x[0]; });
  add_unary(out, "x * 3", [](auto& x) { return x[0] * 3; }, [](auto& x) { return x[0] * 3; });
  add_unary(out, "x / 4", [](auto& x) { return x[0] / 4.0; }, [](auto& x) { return x[0] / 4.0; });
  add_unary(out, "2 / x", [](auto& x) { return 2.0 / x[0]; }, [](auto& x) { return 2.0 / x[0]; }, true);
  add_unary(out, "maximum(x, 1)", [](auto& x) { return maximum(x[0], 1.0); }, [](auto& x) { return maximum(x[0], 1.0); });
  add_unary(out, "maximum(1, x)", [](auto& x) { return maximum(1.0, x[0]); }, [](auto& x) { return maximum(x[0], 1.0); });
  add_unary(out, "lt(2, x)", [](auto& x) { return lt(2.0, x[0]); }, [](auto& x) { return gt(x[0], 2.0); });
  add_unary(out, "pow(x, 2)", [](auto& x) { return pow(x[0], 2.0); }, [](auto& x) { return pow(x[0], 2.0); });
  add_unary(out, "x + 0-d tensor", [](auto& x) { return add(x[0], full({}, 1.5)); }, [](auto& x) { return x[0] + 1.5; });
  return out;
}

// Every unary row of the op table; ops defined on positive reals get data in [1, 23], the others
// data / 4 (exp and friends stay in range).
std::vector<OpCase> unary_cases() {
  std::vector<OpCase> out;
  const std::vector<std::string> positive_only = {"log", "sqrt", "rsqrt", "log1p"};
#define TESSERA_CHECK_UNARY(name, ...)                                                                              \
  if (std::find(positive_only.begin(), positive_only.end(), #name) != positive_only.end())                          \
    add_unary(out, #name, [](auto& x) { return name(x[0]); }, [](auto& x) { return name(x[0]); }, true);             \
  else                                                                                                              \
    add_unary(out, #name, [](auto& x) { return name(x[0] / 4.0); }, [](auto& x) { return name(x[0] / 4.0); });
  TESSERA_UNARY_OPS(TESSERA_CHECK_UNARY)
#undef TESSERA_CHECK_UNARY
  add_unary(out, "clamp", [](auto& x) { return clamp(x[0], -3, 4); }, [](auto& x) { return clamp(x[0], -3, 4); });
  add_unary(out, "logical_not", [](auto& x) { return logical_not(gt(x[0], 0.0)); },
            [](auto& x) { return logical_not(gt(x[0], 0.0)); });
  return out;
}

std::vector<OpCase> where_masked_fill_cases() {
  std::vector<OpCase> out;
  for (const auto& shapes : std::vector<std::vector<Shape>>{{{5, 3}, {5, 3}, {5, 3}}, {{5, 1}, {5, 3}, {3}}})
    out.push_back({"where", Case{shapes, true, false, 600}, [](auto& x) { return where(gt(x[0], 0.0), x[1], x[2]); },
                   [](auto& x) { return where(gt(x[0], 0.0), x[1], x[2]); }});
  out.push_back({"where scalar", Case{{{5, 3}, {5, 3}}}, [](auto& x) { return where(gt(x[0], 0.0), x[1], 7.0); },
                 [](auto& x) { return where(gt(x[0], 0.0), x[1], 7.0); }});
  out.push_back({"where scalar left", Case{{{5, 3}, {3}}}, [](auto& x) { return where(gt(x[1], 0.0), -7.0, x[0]); },
                 [](auto& x) { return where(gt(x[1], 0.0), -7.0, x[0]); }});
  out.push_back({"masked_fill", Case{{{5, 3}, {3}}}, [](auto& x) { return masked_fill(x[0], gt(x[1], 0.0), 9.0); },
                 [](auto& x) { return masked_fill(x[0], gt(x[1], 0.0), 9.0); }});
  return out;
}

std::vector<OpCase> reduction_cases() {
  std::vector<OpCase> out;
  for (const Shape& shape : {Shape{5, 3}, Shape{4, 6}, Shape{2, 1}}) {
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {-1}}) {
      for (bool keep : {false, true}) {
        const Case c{{shape}};
        const std::string args = dims_text(dims) + (keep ? " keepdim" : "");
        out.push_back({"sum" + args, c, [=](auto& x) { return sum(x[0], dims, keep); },
                       [=](auto& x) { return sum(x[0], dims, keep); }});
        out.push_back({"mean" + args, c, [=](auto& x) { return mean(x[0], dims, keep); },
                       [=](auto& x) { return mean(x[0], dims, keep); }});
        out.push_back({"amax" + args, c, [=](auto& x) { return amax(x[0], dims, keep); },
                       [=](auto& x) { return amax(x[0], dims, keep); }});
        out.push_back({"amin" + args, c, [=](auto& x) { return amin(x[0], dims, keep); },
                       [=](auto& x) { return amin(x[0], dims, keep); }});
        out.push_back({"prod" + args, c, [=](auto& x) { return prod(x[0] / 8.0, dims, keep); },
                       [=](auto& x) { return prod(x[0] / 8.0, dims, keep); }});
        out.push_back({"var" + args, c, [=](auto& x) { return var(x[0], dims, 0, keep); },
                       [=](auto& x) { return var(x[0], dims, 0, keep); }});
      }
    }
    for (std::optional<int64_t> dim : {std::optional<int64_t>{}, std::optional<int64_t>{0}, std::optional<int64_t>{1}}) {
      out.push_back({"argmax" + dim_text(dim), Case{{shape}}, [=](auto& x) { return argmax(x[0], dim); },
                     [=](auto& x) { return argmax(x[0], dim); }});
      out.push_back({"argmin" + dim_text(dim) + " keepdim", Case{{shape}}, [=](auto& x) { return argmin(x[0], dim, true); },
                     [=](auto& x) { return argmin(x[0], dim, true); }});
    }
  }
  return out;
}

std::vector<OpCase> matmul_bmm_linear_cases() {
  std::vector<OpCase> out;
  for (const auto& shapes : std::vector<std::vector<Shape>>{{{5, 3}, {3, 4}}, {{4, 6}, {6, 2}}, {{3}, {3, 4}},
                                                             {{5, 3}, {3}}, {{4}, {4}}, {{2, 5, 3}, {3, 4}}})
    out.push_back({"matmul", Case{shapes, true, false, 1024}, [](auto& x) { return matmul(x[0], x[1]); },
                   [](auto& x) { return matmul(x[0], x[1]); }});
  out.push_back({"matmul batch broadcast", Case{{{2, 1, 3, 2}, {3, 2, 4}}, true, false, 512},
                 [](auto& x) { return matmul(x[0], x[1]); }, [](auto& x) { return matmul(x[0], x[1]); }});
  out.push_back({"bmm", Case{{{3, 5, 2}, {3, 2, 4}}, true, false, 1024}, [](auto& x) { return bmm(x[0], x[1]); },
                 [](auto& x) { return bmm(x[0], x[1]); }});
  out.push_back({"linear", Case{{{5, 3}, {4, 3}, {4}}, true, false, 1024},
                 [](auto& x) { return linear(x[0], x[1], x[2]); }, [](auto& x) { return linear(x[0], x[1], x[2]); }});
  out.push_back({"linear no bias", Case{{{2, 5, 3}, {4, 3}}, true, false, 1024},
                 [](auto& x) { return linear(x[0], x[1]); }, [](auto& x) { return linear(x[0], x[1]); }});
  return out;
}

std::vector<OpCase> softmax_norm_cases() {
  std::vector<OpCase> out;
  for (const Shape& shape : {Shape{5, 3}, Shape{4, 6}}) {
    for (int64_t dim : {0, 1, -1}) {
      out.push_back({"softmax" + dim_text(dim), Case{{shape}}, [=](auto& x) { return softmax(x[0] / 4.0, dim); },
                     [=](auto& x) { return softmax(x[0] / 4.0, dim); }});
      out.push_back({"log_softmax" + dim_text(dim), Case{{shape}}, [=](auto& x) { return log_softmax(x[0] / 4.0, dim); },
                     [=](auto& x) { return log_softmax(x[0] / 4.0, dim); }});
    }
  }
  out.push_back({"layer_norm", Case{{{5, 3}, {3}, {3}}, true, false, 512},
                 [](auto& x) { return layer_norm(x[0], {3}, x[1], x[2]); },
                 [](auto& x) { return layer_norm(x[0], {3}, x[1], x[2]); }});
  out.push_back({"layer_norm 2 dims", Case{{{2, 3, 4}}}, [](auto& x) { return layer_norm(x[0], {3, 4}); },
                 [](auto& x) { return layer_norm(x[0], {3, 4}); }});
  out.push_back({"rms_norm", Case{{{5, 4}, {4}}}, [](auto& x) { return rms_norm(x[0], {4}, x[1]); },
                 [](auto& x) { return rms_norm(x[0], {4}, x[1]); }});
  return out;
}

std::vector<OpCase> embedding_cases() {
  std::vector<OpCase> out;
  for (const Shape& weight : {Shape{7, 3}, Shape{12, 4}, Shape{2, 5}}) {
    for (const Shape& ids : {Shape{2, 5}, Shape{3}}) {
      out.push_back({"embedding", Case{{weight, ids}, true, false, 4096, 1e-4, {Tensor(), indices(ids, weight[0])}},
                     [](auto& x) { return embedding(x[0], x[1]); }, [](auto& x) { return embedding(x[0], x[1]); }});
    }
  }
  return out;
}

std::vector<OpCase> cross_entropy_cases() {
  std::vector<OpCase> out;
  for (Reduction reduction : {Reduction::none, Reduction::sum, Reduction::mean}) {
    for (const auto& [logits, target] : std::vector<std::pair<Shape, Shape>>{{{6, 7}, {6}}, {{4, 5, 3}, {4, 3}}, {{5}, {}}}) {
      const int64_t classes = logits.size() == 1 ? logits[0] : logits[1];
      const Tensor t = indices(target, classes, target.numel() > 1 ? std::optional<int64_t>(-100) : std::nullopt);
      out.push_back({"cross_entropy " + reduction_text(reduction), Case{{logits, target}, true, false, 4096, 1e-4, {Tensor(), t}},
                     [=](auto& x) { return cross_entropy(x[0] / 4.0, x[1], -100, reduction); },
                     [=](auto& x) { return cross_entropy(x[0] / 4.0, x[1], -100, reduction); }});
    }
  }
  return out;
}

std::vector<OpCase> view_cases() {
  std::vector<OpCase> out;
  const Case c6x4{{{6, 4}}}, c5x3{{{5, 3}}}, c2x3x4{{{2, 3, 4}}};
  for (const Shape& to : {Shape{24}, Shape{4, 6}, Shape{3, 2, 4}, Shape{6, 2, 2}, Shape{1, 24}, Shape{-1, 8}})
    out.push_back({"reshape " + to.to_string(), c6x4, [=](auto& x) { return reshape(x[0], to); },
                   [=](auto& x) { return reshape(x[0], to); }});
  out.push_back({"reshape uneven", c5x3, [](auto& x) { return reshape(x[0], {15}); },
                 [](auto& x) { return reshape(x[0], {15}); }});
  out.push_back({"reshape split", Case{{{12, 2}}}, [](auto& x) { return reshape(x[0], {3, 4, 2}); },
                 [](auto& x) { return reshape(x[0], {3, 4, 2}); }});
  out.push_back({"view", c2x3x4, [](auto& x) { return view(x[0], {6, 4}); }, [](auto& x) { return x[0].view({6, 4}); }});
  out.push_back({"flatten", c2x3x4, [](auto& x) { return flatten(x[0], 1); }, [](auto& x) { return x[0].flatten(1); }});
  out.push_back({"unsqueeze", c5x3, [](auto& x) { return unsqueeze(x[0], 1); }, [](auto& x) { return x[0].unsqueeze(1); }});
  out.push_back({"squeeze", Case{{{5, 1, 3}}}, [](auto& x) { return squeeze(x[0]); }, [](auto& x) { return x[0].squeeze(); }});
  out.push_back({"squeeze dim", Case{{{1, 3}}}, [](auto& x) { return squeeze(x[0], 0); },
                 [](auto& x) { return x[0].squeeze(0); }});
  out.push_back({"transpose", c5x3, [](auto& x) { return transpose(x[0], 0, 1); },
                 [](auto& x) { return x[0].transpose(0, 1); }});
  out.push_back({"permute", c2x3x4, [](auto& x) { return permute(x[0], {2, 0, 1}); },
                 [](auto& x) { return x[0].permute({2, 0, 1}); }});
  out.push_back({"expand", Case{{{5, 1}}}, [](auto& x) { return expand(x[0], {2, 5, 3}); },
                 [](auto& x) { return x[0].expand({2, 5, 3}); }});
  return out;
}

std::vector<OpCase> narrow_select_cat_stack_split_chunk_cases() {
  std::vector<OpCase> out;
  const Case c{{{7, 5}}};
  for (int64_t dim : {0, 1})
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {1, 3}, {2, 0}, {0, 5}}) {
      const int64_t start = first, length = count;
      const std::string args = dim_text(dim) + " start " + std::to_string(start) + " length " + std::to_string(length);
      out.push_back({"narrow" + args, c, [=](auto& x) { return narrow(x[0], dim, start, length); },
                     [=](auto& x) { return x[0].narrow(dim, start, length); }});
      out.push_back({"narrow then add" + args, c, [=](auto& x) { return narrow(x[0], dim, start, length) * 2; },
                     [=](auto& x) { return x[0].narrow(dim, start, length) * 2; }});
    }
  for (int64_t dim : {0, 1, -1})
    out.push_back({"select" + dim_text(dim), c, [=](auto& x) { return select(x[0], dim, 3); },
                   [=](auto& x) { return x[0].select(dim, 3); }});
  for (int64_t dim : {0, 1}) {
    out.push_back({"cat" + dim_text(dim), Case{{{4, 3}, {4, 3}}, true, false, 512},
                   [=](auto& x) { return cat({x[0], x[1]}, dim); }, [=](auto& x) { return cat({x[0], x[1]}, dim); }});
    out.push_back({"stack" + dim_text(dim), Case{{{4, 3}, {4, 3}}, true, false, 512},
                   [=](auto& x) { return stack({x[0], x[1]}, dim); }, [=](auto& x) { return stack({x[0], x[1]}, dim); }});
    out.push_back({"split" + dim_text(dim), c,
                   [=](auto& x) { return split(x[0], 2, dim).back() + split(x[0], 2, dim).front(); },
                   [=](auto& x) { return split(x[0], 2, dim).back() + split(x[0], 2, dim).front(); }});
  }
  out.push_back({"cat uneven", Case{{{4, 3}, {2, 3}}, true, false, 512}, [](auto& x) { return cat({x[0], x[1]}, 0); },
                 [](auto& x) { return cat({x[0], x[1]}, 0); }});
  out.push_back({"chunk", c, [](auto& x) { return chunk(x[0], 3, 0)[1]; }, [](auto& x) { return chunk(x[0], 3, 0)[1]; }});
  out.push_back({"split sizes", c, [](auto& x) { return split(x[0], std::vector<int64_t>{1, 4}, 1)[1]; },
                 [](auto& x) { return split(x[0], std::vector<int64_t>{1, 4}, 1)[1]; }});
  return out;
}

// The reductions built from others, on every placement of the input: a sharded reduced dim is
// reduced through Partials, never by gathering the input.
std::vector<OpCase> composite_reduction_cases() {
  std::vector<OpCase> out;
  for (const auto& shape : {Shape{5, 3}, Shape{4, 6}}) {
    const Case c{{shape}};
    out.push_back({"logsumexp", c, [](auto& x) { return logsumexp(x[0] / 4.0, {1}); },
                   [](auto& x) { return logsumexp(x[0] / 4.0, {1}); }});
    out.push_back({"logsumexp all keepdim", c, [](auto& x) { return logsumexp(x[0] / 4.0, {}, true); },
                   [](auto& x) { return logsumexp(x[0] / 4.0, {}, true); }});
    out.push_back({"std", c, [](auto& x) { return tessera::std(x[0], {0}); }, [](auto& x) { return tessera::std(x[0], {0}); }});
    for (double ord : {2.0, 1.0, kInf, -kInf, 0.0, 3.0}) {
      std::ostringstream ord_text;
      ord_text << ord;  // 2, 1, inf, -inf, 0, 3
      out.push_back({"vector_norm ord " + ord_text.str(), c, [ord](auto& x) { return vector_norm(x[0], ord, {0}); },
                     [ord](auto& x) { return vector_norm(x[0], ord, {0}); }});
    }
    out.push_back({"all", Case{{shape}, false}, [](auto& x) { return all(gt(x[0], -9.0), {1}); },
                   [](auto& x) { return all(gt(x[0], -9.0), {1}); }});
    out.push_back({"any", Case{{shape}, false}, [](auto& x) { return any(gt(x[0], 9.0)); },
                   [](auto& x) { return any(gt(x[0], 9.0)); }});
    out.push_back({"max values", c, [](auto& x) { return max(x[0], 1).values; }, [](auto& x) { return max(x[0], 1).values; }});
    out.push_back({"max indices", Case{{shape}, false}, [](auto& x) { return max(x[0], 0, true).indices; },
                   [](auto& x) { return max(x[0], 0, true).indices; }});
    out.push_back({"min values", c, [](auto& x) { return min(x[0], 0).values; }, [](auto& x) { return min(x[0], 0).values; }});
  }
  return out;
}

// Scans over every placement, uneven pieces and empty ones included, on both dims.
std::vector<OpCase> cumsum_cumprod_cases() {
  std::vector<OpCase> out;
  for (const auto& shape : {Shape{5, 3}, Shape{7, 2}, Shape{2, 1}})
    for (int64_t dim : {0, 1, -1}) {
      out.push_back({"cumsum dim " + std::to_string(dim), Case{{shape}}, [dim](auto& x) { return cumsum(x[0], dim); },
                     [dim](auto& x) { return cumsum(x[0], dim); }});
      // Factors near 1 keep products small and exact enough.
      out.push_back({"cumprod dim " + std::to_string(dim), Case{{shape}, true, false, 4096, 1e-4},
                     [dim](auto& x) { return cumprod(x[0] / 40.0 + 1.0, dim); },
                     [dim](auto& x) { return cumprod(x[0] / 40.0 + 1.0, dim); }});
    }
  out.push_back({"cumsum i64", Case{{{6, 2}}, false, false, 4096, 0, {arange(12).reshape({6, 2})}},
                 [](auto& x) { return cumsum(x[0], 0); }, [](auto& x) { return cumsum(x[0], 0); }});
  return out;
}

std::vector<OpCase> sort_topk_cases() {
  std::vector<OpCase> out;
  for (const auto& shape : {Shape{5, 3}, Shape{3, 7}}) {
    const Case c{{shape}};
    out.push_back({"sort values", c, [](auto& x) { return sort(x[0], 0).values; },
                   [](auto& x) { return sort(x[0], 0).values; }});
    out.push_back({"sort indices desc", Case{{shape}, false}, [](auto& x) { return sort(x[0], 1, true).indices; },
                   [](auto& x) { return sort(x[0], 1, true).indices; }});
    for (int64_t k : {1, 2, 3})
      for (bool largest : {true, false}) {
        const std::string name = "topk k=" + std::to_string(k) + (largest ? " largest" : " smallest");
        out.push_back({name + " values dim 0", c, [=](auto& x) { return topk(x[0], k, 0, largest).values; },
                       [=](auto& x) { return topk(x[0], k, 0, largest).values; }});
        out.push_back({name + " indices dim 0", Case{{shape}, false}, [=](auto& x) { return topk(x[0], k, 0, largest).indices; },
                       [=](auto& x) { return topk(x[0], k, 0, largest).indices; }});
        out.push_back({name + " indices dim 1", Case{{shape}, false}, [=](auto& x) { return topk(x[0], k, 1, largest).indices; },
                       [=](auto& x) { return topk(x[0], k, 1, largest).indices; }});
      }
  }
  return out;
}

std::vector<OpCase> loss_product_cases() {
  std::vector<OpCase> out;
  const Tensor target = from_vector<int64_t>({2, 0, -100, 1, 2});
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none})
    out.push_back({"nll_loss " + reduction_text(r), Case{{{5, 3}, {5}}, true, false, 200, 1e-4, {Tensor(), target}},
                   [r](auto& x) { return nll_loss(log_softmax(x[0] / 4.0, 1), x[1], -100, r); },
                   [r](auto& x) { return nll_loss(log_softmax(x[0] / 4.0, 1), x[1], -100, r); }});
  out.push_back({"mse_loss", Case{{{5, 3}, {3}}}, [](auto& x) { return mse_loss(x[0], x[1]); },
                 [](auto& x) { return mse_loss(x[0], x[1]); }});
  out.push_back({"mse_loss none", Case{{{5, 3}, {5, 3}}, true, false, 200},
                 [](auto& x) { return mse_loss(x[0], x[1], Reduction::none); },
                 [](auto& x) { return mse_loss(x[0], x[1], Reduction::none); }});
  out.push_back({"addmm", Case{{{3}, {5, 4}, {4, 3}}, true, false, 200},
                 [](auto& x) { return addmm(x[0], x[1], x[2], 0.5, 2.0); },
                 [](auto& x) { return addmm(x[0], x[1], x[2], 0.5, 2.0); }});
  out.push_back({"baddbmm", Case{{{2, 5, 3}, {2, 5, 4}, {2, 4, 3}}, false, false, 200},
                 [](auto& x) { return baddbmm(x[0], x[1], x[2]); }, [](auto& x) { return baddbmm(x[0], x[1], x[2]); }});
  return out;
}

// einsum's equation is its rule: every placement of the operands, contracted letters sharded
// included (P(sum) results).
std::vector<OpCase> einsum_cases() {
  std::vector<OpCase> out;
  for (const auto& [equation, shapes] : std::vector<std::pair<std::string, std::vector<Shape>>>{
           {"ij,jk->ik", {{5, 3}, {3, 4}}},
           {"bij,bjk->bik", {{2, 3, 4}, {2, 4, 5}}},
           {"ij->j", {{5, 3}}},
           {"ij,ij->", {{5, 3}, {5, 3}}},
           {"ij,jk,kl->il", {{3, 4}, {4, 2}, {2, 5}}}})
    out.push_back({"einsum " + equation, Case{shapes, true, false, 100}, [e = equation](auto& x) { return einsum(e, x); },
                   [e = equation](auto& x) { return einsum(e, x); }});
  return out;
}

// Indexing on every placement of x, index and src (index as given integer data).
std::vector<OpCase> indexing_cases() {
  std::vector<OpCase> out;
  const Tensor index = from_vector<int64_t>({2, 0, 1, 1, 0, 2, 2, 2, 0, 1}, {5, 2});  // into dim 1 of [5, 3]
  const Tensor rows = from_vector<int64_t>({4, 0, 4, 2});                                // into dim 0 of [5, 3]
  out.push_back({"gather", Case{{{5, 3}, {5, 2}}, true, false, 300, 1e-4, {Tensor(), index}},
                 [](auto& x) { return gather(x[0], 1, x[1]); }, [](auto& x) { return gather(x[0], 1, x[1]); }});
  const Tensor same_shape = from_vector<int64_t>({2, 0, 1, 1, 0, 2, 2, 2, 0, 1, 0, 0, 1, 2, 0}, {5, 3});
  out.push_back({"gather same shape", Case{{{5, 3}, {5, 3}}, true, false, 300, 1e-4, {Tensor(), same_shape}},
                 [](auto& x) { return gather(x[0], 1, x[1]); }, [](auto& x) { return gather(x[0], 1, x[1]); }});
  out.push_back({"scatter_add", Case{{{5, 3}, {5, 3}, {5, 3}}, true, false, 300, 1e-4, {Tensor(), same_shape}},
                 [](auto& x) { return scatter_add(x[0], 1, x[1], x[2]); },
                 [](auto& x) { return scatter_add(x[0], 1, x[1], x[2]); }});
  const Tensor distinct = from_vector<int64_t>({2, 0, 1, 1, 0, 2, 2, 1, 0, 0, 1, 2, 1, 2, 0}, {5, 3});
  out.push_back({"scatter", Case{{{5, 3}, {5, 3}, {5, 3}}, true, false, 300, 1e-4, {Tensor(), distinct}},
                 [](auto& x) { return scatter(x[0], 1, x[1], x[2]); }, [](auto& x) { return scatter(x[0], 1, x[1], x[2]); }});
  out.push_back({"index_select", Case{{{5, 3}, {4}}, true, false, 300, 1e-4, {Tensor(), rows}},
                 [](auto& x) { return index_select(x[0], 0, x[1]); }, [](auto& x) { return index_select(x[0], 0, x[1]); }});
  out.push_back({"index_add", Case{{{5, 3}, {4}, {4, 3}}, true, false, 300, 1e-4, {Tensor(), rows}},
                 [](auto& x) { return index_add(x[0], 0, x[1], x[2]); }, [](auto& x) { return index_add(x[0], 0, x[1], x[2]); }});
  return out;
}

}  // namespace

// One instantiation per family of ops (the former TEST(ShardedOps, <family>) loops).
INSTANTIATE_TEST_SUITE_P(ArithmeticOfTwoDTensors, ShardedOp, ::testing::ValuesIn(arithmetic_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(PowComparisonsAndLogicalOps, ShardedOp, ::testing::ValuesIn(pow_comparison_logical_cases()),
                         case_name);
INSTANTIATE_TEST_SUITE_P(ScalarOperandsOnEitherSide, ShardedOp, ::testing::ValuesIn(scalar_operand_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(UnaryOps, ShardedOp, ::testing::ValuesIn(unary_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(WhereAndMaskedFill, ShardedOp, ::testing::ValuesIn(where_masked_fill_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Reductions, ShardedOp, ::testing::ValuesIn(reduction_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(MatmulBmmLinear, ShardedOp, ::testing::ValuesIn(matmul_bmm_linear_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(SoftmaxAndNorms, ShardedOp, ::testing::ValuesIn(softmax_norm_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(EmbeddingVocabularyAndDimSharded, ShardedOp, ::testing::ValuesIn(embedding_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(CrossEntropyWithTheClassDimSharded, ShardedOp, ::testing::ValuesIn(cross_entropy_cases()),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Views, ShardedOp, ::testing::ValuesIn(view_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(NarrowSelectCatStackSplitChunk, ShardedOp,
                         ::testing::ValuesIn(narrow_select_cat_stack_split_chunk_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(CompositeReductions, ShardedOp, ::testing::ValuesIn(composite_reduction_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(CumsumAndCumprod, ShardedOp, ::testing::ValuesIn(cumsum_cumprod_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(SortAndTopk, ShardedOp, ::testing::ValuesIn(sort_topk_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(LossesAndProducts, ShardedOp, ::testing::ValuesIn(loss_product_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Einsum, ShardedOp, ::testing::ValuesIn(einsum_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(IndexingOps, ShardedOp, ::testing::ValuesIn(indexing_cases()), case_name);

// --- checks beyond the sweep: bytes moved, layouts kept, errors ---------------------------------

// topk over a sharded dim moves k candidates per piece, not the dim; cumsum over it moves one
// slice of totals per piece.
TEST(ShardedOps, TopkAndCumsumOverAShardedDimMoveLittle) {
  for_each_world({4}, [] {
    const int64_t p = world_size();
    const DeviceMesh mesh({p}, {"x"});
    const Tensor global = data({400, 2}, 3);
    const DTensor x = distribute_tensor(global, mesh, {Shard{0}});
    CommDebugMode mode;
    const auto best = topk(x, 3, 0);
    EXPECT_EQ(mode.count(CollectiveKind::all_gather), 2);  // values and indices
    // p pieces x 3 candidates x 2 columns, values (f32) and indices (i64), received by each rank.
    EXPECT_LE(mode.total_bytes_received(), p * 3 * 2 * (4 + 8));
    EXPECT_TRUE(equal(best.values.full_tensor(), topk(global, 3, 0).values));
    CommDebugMode scan_mode;
    const DTensor running = cumsum(x, 0);
    EXPECT_EQ(scan_mode.total_count(), 1);
    EXPECT_LE(scan_mode.total_bytes_received(), p * 2 * 8);  // one f64 total per column per piece
    EXPECT_EQ(running.placements(), (Placements{Shard{0}}));
    EXPECT_TRUE(allclose(running.full_tensor(), cumsum(global, 0)));
  });
}

// topk keeps the other dims' explicit (uneven) piece sizes: rows [1, 4] stay [1, 4].
TEST(ShardedOps, TopkKeepsExplicitPieceSizesOfOtherDims) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    std::vector<int64_t> rows(static_cast<size_t>(world_size()), 1);
    rows.back() = 6 - (world_size() - 1);
    const Tensor global = data({6, 5}, 4);
    const Layout layout(global.shape(), global.dtype(), mesh.spec(), {Shard{0}}, {}, {{0, rows}});
    const DTensor x(block_of(global, layout.block(mesh.coordinate())), mesh, layout);
    const auto best = topk(x, 2, 1);
    EXPECT_EQ(best.values.layout().piece_sizes(0), rows);
    EXPECT_TRUE(equal(best.values.full_tensor(), topk(global, 2, 1).values));
    EXPECT_TRUE(equal(best.indices.full_tensor(), topk(global, 2, 1).indices));
  });
}

TEST(ShardedOps, ReductionScanSortErrors) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor x = distribute_tensor(data({5, 3}, 1), mesh, {Shard{0}});
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)topk(x, 6, 0); }, {"[topk]", "k = 6 out of range", "size 5"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)cumsum(x, 2); }, {"[cumsum]", "dim 2 out of range", "[5, 3]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)sort(x, -3); }, {"[sort]", "dim -3 out of range"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)logsumexp(x, {0, 0}); }, {"[logsumexp]", "more than once"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)max(x, 3); }, {"[max]", "dim 3 out of range"}));
    EXPECT_TRUE(throws_with<ShardingError>([] { (void)cumsum(DTensor(), 0); }, {"[cumsum]", "undefined"}));
  });
}

// Each rank draws its block of the one global mask: the same numbers as the Tensor dropout.
TEST(ShardedOps, DropoutEqualsTheUnshardedDropoutBitForBit) {
  for_each_world(kWorlds, [] {
    for (const auto& mesh_shape : sweep_meshes(world_size())) {
      const DeviceMesh mesh = sweep_mesh(mesh_shape);
      for (const Shape& shape : {Shape{5, 3}, Shape{7, 2}}) {
        const Tensor global = data(shape, 1);
        manual_seed(7);
        const Tensor expected = dropout(global, 0.3);
        for (const Placements& placements : placement_combinations(2, mesh.ndim(), true)) {
          const DTensor x = make_input(global, mesh, placements);
          manual_seed(7);
          const Tensor got = dropout(x, 0.3).full_tensor();
          bool partial = false;
          for (const auto& p : placements) partial |= is_partial(p);
          // A Partial input is reduced before the mask applies: same values up to the sum's rounding.
          EXPECT_TRUE(partial ? allclose(got, expected, 1e-6, 1e-6) : equal(got, expected))
              << "dropout on " << mesh.to_string() << " as " << to_string(placements);
        }
      }
    }
    const DeviceMesh line({world_size()}, {"x"});
    const DTensor x = distribute_tensor(data({4, 2}, 2), line, {Shard{0}});
    EXPECT_TRUE(equal(dropout(x, 0.0).full_tensor(), x.full_tensor()));
    EXPECT_TRUE(equal(dropout(x, 0.5, false).full_tensor(), x.full_tensor()));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)dropout(x, 1.0); }, {"[dropout]", "p = 1", "[0, 1)"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)dropout(distribute_tensor(arange(4), line, {Shard{0}}), 0.5); },
                                        {"[dropout]", "floating"}));
  });
}

// Rows sharded alike in x and index: gather along the other dim moves no data (one scalar moves:
// the collective index-range check, so that a bad index throws on every rank); a sharded index
// of index_add gives a Partial(sum) (each rank adds the rows it holds).
TEST(ShardedOps, IndexingKeepsShardsThatLineUp) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor x = distribute_tensor(data({8, 3}, 1), mesh, {Shard{0}});
    const DTensor index = distribute_tensor(zeros({8, 2}, DType::i64), mesh, {Shard{0}});
    CommDebugMode mode;
    const DTensor picked = gather(x, 1, index);
    EXPECT_EQ(mode.total_count(), 1);
    EXPECT_LE(mode.total_bytes_received(), 8 * world_size());
    EXPECT_EQ(picked.placements(), (Placements{Shard{0}}));
    const DTensor rows = distribute_tensor(from_vector<int64_t>({1, 1, 0, 2, 2, 0, 1, 3}), mesh, {Shard{0}});
    const DTensor src = distribute_tensor(data({8, 3}, 2), mesh, {Shard{0}});
    const DTensor added = index_add(distribute_tensor(data({4, 3}, 3), mesh, {Replicate{}}), 0, rows, src);
    EXPECT_EQ(added.placements(), (Placements{Partial{}}));
    EXPECT_TRUE(allclose(added.full_tensor(), index_add(data({4, 3}, 3), 0, rows.full_tensor(), src.full_tensor())));
  });
}

TEST(ShardedOps, IndexingErrorsMatchTheTensorOps) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor x = distribute_tensor(data({5, 3}, 1), mesh, {Shard{0}});
    const DTensor bad = distribute_tensor(from_vector<int64_t>({0, 3, 1, 0, 0}, {5, 1}), mesh, {Shard{0}});
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)gather(x, 1, bad); }, {"[gather]", "index", "out of [0, 3)"}));
    const DTensor flat = distribute_tensor(from_vector<int64_t>({0, 1}), mesh, {Replicate{}});
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)gather(x, 1, flat); }, {"[gather]", "as many dims"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)index_select(x, 2, flat); }, {"[index_select]", "dim 2 out of range"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)index_select(x, 0, x); }, {"[index_select]", "integer tensor"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)index_add(x, 0, flat, x); }, {"[index_add]", "expected [2, 3]"}));
  });
}
