// The op table's ops with arguments of several kinds, by name: selection, linear algebra, nn,
// view, shape and index ops (and conv2d, the spatial front end's). Each row lists what it
// takes (tensors, scalars, integers, a shape, a text) in call()'s order, checked at the call so
// that misplaced arguments fail on the controller, not on the workers; the worker runs DTensor's
// function, so each op is differentiable wherever DTensor's is.
#include <tessera/controller/detail/op_rows.hpp>

#include <optional>
#include <string>
#include <utility>

#include <tessera/core/error.hpp>
#include <tessera/domain/spatial.hpp>
#include <tessera/dtensor/ops.hpp>

namespace tessera::controller::detail {

namespace {

// Optional trailing arguments.
std::optional<DTensor> input_at(const std::vector<DTensor>& in, size_t i) {
  return i < in.size() ? std::optional<DTensor>(in[i]) : std::nullopt;
}
double scalar_or(const ListArgs& a, size_t i, double otherwise) {
  return i < a.scalars.size() ? a.scalars[i] : otherwise;
}
int64_t int_or(const ListArgs& a, size_t i, int64_t otherwise) { return i < a.ints.size() ? a.ints[i] : otherwise; }

Reduction reduction_at(const ListArgs& a, size_t i, const char* op) {
  const int64_t r = int_or(a, i, 1);
  TESSERA_CHECK(r >= 0 && r <= 2, ValueError, op, "reduction ", r, " is not one of 0 (none), 1 (mean), 2 (sum)");
  return static_cast<Reduction>(r);
}

// conv2d's integers: stride, padding, dilation (two each, in that order, any trailing ones
// left at torch's defaults), then groups.
bool conv_integers(size_t count) { return count == 0 || count == 2 || count == 4 || count == 6 || count == 7; }
std::vector<int64_t> pair_at(const ListArgs& a, size_t i, int64_t otherwise) {
  return 2 * i + 1 < a.ints.size() ? std::vector<int64_t>{a.ints[2 * i], a.ints[2 * i + 1]}
                                   : std::vector<int64_t>{otherwise, otherwise};
}

// roll's integers: one shift of the flattened tensor, or shifts then as many dims.
bool roll_integers(size_t count) { return count == 1 || (count >= 2 && count % 2 == 0); }

}  // namespace

namespace {

OpArgs parse(const Takes& t, const CallArgs& a, const std::string& op) {
  const bool ints =
      t.integers_fit ? t.integers_fit(a.ints.size()) : a.ints.size() >= t.ints_least && a.ints.size() <= t.ints_most;
  check_takes(a.scalars.size() >= t.scalars_least && a.scalars.size() <= t.scalars_most && ints &&
                  a.shape.empty() != t.shape && a.text.empty() != t.text && a.placements.empty(),
              a, op, t.what);
  return ListArgs{a.scalars, a.ints, a.shape, a.text};
}

}  // namespace

void row(OpTable& table, const char* name, int inputs, int most_inputs, Takes takes, ListRun run) {
  takes.scalars_most = std::max(takes.scalars_most, takes.scalars_least);
  takes.ints_most = std::max(takes.ints_most, takes.ints_least);
  table[name] = OpRow{inputs, [takes](const CallArgs& a, const std::string& op) { return parse(takes, a, op); },
                      [run = std::move(run)](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {
                        return run(in, std::get<ListArgs>(a));
                      },
                      most_inputs};
}

void add_structured_rows(OpTable& t) {
  using In = const std::vector<DTensor>&;
  using A = const ListArgs&;
  // Selection.
  row(t, "logical_not", 1, 0, {}, [](In in, A) { return logical_not(in[0]); });
  row(t, "where", 3, 0, {}, [](In in, A) { return where(in[0], in[1], in[2]); });
  row(t, "masked_fill", 2, 0, {.scalars_least = 1, .what = "a mask tensor and one scalar (the value)"},
      [](In in, A a) { return masked_fill(in[0], in[1], Scalar(a.scalars[0])); });
  row(t, "clamp", 1, 0, {.scalars_least = 2, .what = "two scalars [lo, hi]"},
      [](In in, A a) { return clamp(in[0], Scalar(a.scalars[0]), Scalar(a.scalars[1])); });
  // Linear algebra.
  row(t, "bmm", 2, 0, {}, [](In in, A) { return bmm(in[0], in[1]); });
  row(t, "linear", 2, 3, {}, [](In in, A) { return linear(in[0], in[1], input_at(in, 2)); });
  row(t, "einsum", 1, 64, {.text = true, .what = "its operands and a text (the equation)"},
      [](In in, A a) { return einsum(a.text, in); });
  // nn.
  row(t, "log_softmax", 1, 0, {.ints_least = 1, .what = "one dim"},
      [](In in, A a) { return log_softmax(in[0], a.ints[0]); });
  row(t, "layer_norm", 1, 3,
      {.scalars_most = 1, .shape = true, .what = "a shape (normalized_shape) and at most one scalar (eps)"},
      [](In in, A a) { return layer_norm(in[0], a.shape, input_at(in, 1), input_at(in, 2), scalar_or(a, 0, 1e-5)); });
  row(t, "rms_norm", 1, 2,
      {.scalars_most = 1, .shape = true, .what = "a shape (normalized_shape) and at most one scalar (eps)"},
      [](In in, A a) { return rms_norm(in[0], a.shape, input_at(in, 1), scalar_or(a, 0, 1e-6)); });
  row(t, "embedding", 2, 0, {.ints_most = 1, .what = "at most one integer (padding_idx)"}, [](In in, A a) {
    return embedding(in[0], in[1], a.ints.empty() ? std::nullopt : std::optional<int64_t>(a.ints[0]));
  });
  const Takes loss{.ints_most = 2, .what = "at most two integers [ignore_index, reduction (0 none, 1 mean, 2 sum)]"};
  row(t, "cross_entropy", 2, 0, loss,
      [](In in, A a) { return cross_entropy(in[0], in[1], int_or(a, 0, -100), reduction_at(a, 1, "cross_entropy")); });
  row(t, "nll_loss", 2, 0, loss,
      [](In in, A a) { return nll_loss(in[0], in[1], int_or(a, 0, -100), reduction_at(a, 1, "nll_loss")); });
  row(t, "mse_loss", 2, 0, {.ints_most = 1, .what = "at most one integer [reduction (0 none, 1 mean, 2 sum)]"},
      [](In in, A a) { return mse_loss(in[0], in[1], reduction_at(a, 0, "mse_loss")); });
  row(t, "dropout", 1, 0,
      {.scalars_least = 1, .ints_most = 1, .what = "one scalar (p) and at most one integer (training)"},
      [](In in, A a) { return dropout(in[0], a.scalars[0], int_or(a, 0, 1) != 0); });
  row(t, "scaled_dot_product_attention", 3, 4,
      {.scalars_most = 2, .ints_most = 1, .what = "at most two scalars [dropout_p, scale] and one integer [is_causal]"},
      [](In in, A a) {
        return scaled_dot_product_attention(in[0], in[1], in[2], input_at(in, 3), scalar_or(a, 0, 0.0),
                                            int_or(a, 0, 0) != 0,
                                            a.scalars.size() > 1 ? std::optional<double>(a.scalars[1]) : std::nullopt);
      });
  row(t, "conv2d", 2, 3,
      {.integers_fit = conv_integers, .what = "integers [stride h, w, padding h, w, dilation h, w, groups] (a prefix)"},
      [](In in, A a) {
        return conv2d(in[0], in[1], input_at(in, 2), pair_at(a, 0, 1), pair_at(a, 1, 0), pair_at(a, 2, 1),
                      int_or(a, 6, 1));
      });
  // Views.
  row(t, "permute", 1, 0, {.ints_most = kAny, .what = "integers (the dims)"},
      [](In in, A a) { return permute(in[0], a.ints); });
  row(t, "expand", 1, 0, {.shape = true, .what = "a shape"}, [](In in, A a) { return expand(in[0], a.shape); });
  row(t, "narrow", 1, 0, {.ints_least = 3, .what = "three integers [dim, start, length]"},
      [](In in, A a) { return narrow(in[0], a.ints[0], a.ints[1], a.ints[2]); });
  row(t, "cat", 1, 64, {.ints_most = 1, .what = "at most one integer (the dim)"},
      [](In in, A a) { return cat(in, int_or(a, 0, 0)); });
  row(t, "stack", 1, 64, {.ints_most = 1, .what = "at most one integer (the dim)"},
      [](In in, A a) { return stack(in, int_or(a, 0, 0)); });
  // Shape ops.
  row(t, "flip", 1, 0, {.ints_most = kAny, .what = "integers (the dims)"},
      [](In in, A a) { return flip(in[0], a.ints); });
  row(t, "roll", 1, 0, {.integers_fit = roll_integers, .what = "integers [shift] or [shifts..., dims...]"},
      [](In in, A a) {
        if (a.ints.size() == 1) return roll(in[0], a.ints);
        const auto half = static_cast<std::ptrdiff_t>(a.ints.size() / 2);
        return roll(in[0], std::vector<int64_t>(a.ints.begin(), a.ints.begin() + half),
                    std::vector<int64_t>(a.ints.begin() + half, a.ints.end()));
      });
  row(t, "tril", 1, 0, {.ints_most = 1, .what = "at most one integer (the diagonal)"},
      [](In in, A a) { return tril(in[0], int_or(a, 0, 0)); });
  row(t, "triu", 1, 0, {.ints_most = 1, .what = "at most one integer (the diagonal)"},
      [](In in, A a) { return triu(in[0], int_or(a, 0, 0)); });
  row(t, "repeat", 1, 0, {.ints_least = 1, .ints_most = kAny, .what = "integers (the repeats)"},
      [](In in, A a) { return repeat(in[0], a.ints); });
  row(t, "pad", 1, 0,
      {.scalars_most = 1,
       .ints_least = 2,
       .ints_most = kAny,
       .what = "integers (the pads) and at most one scalar (the value)"},
      [](In in, A a) { return pad(in[0], a.ints, PadMode::constant, Scalar(scalar_or(a, 0, 0.0))); });
  // Indexing along one dim.
  const Takes dim{.ints_least = 1, .what = "one integer (the dim)"};
  row(t, "gather", 2, 0, dim, [](In in, A a) { return gather(in[0], a.ints[0], in[1]); });
  row(t, "index_select", 2, 0, dim, [](In in, A a) { return index_select(in[0], a.ints[0], in[1]); });
  row(t, "scatter", 3, 0, dim, [](In in, A a) { return scatter(in[0], a.ints[0], in[1], in[2]); });
  row(t, "scatter_add", 3, 0, dim, [](In in, A a) { return scatter_add(in[0], a.ints[0], in[1], in[2]); });
  row(t, "index_add", 3, 0,
      {.scalars_most = 1, .ints_least = 1, .what = "one integer (the dim) and at most one scalar (alpha)"},
      [](In in, A a) { return index_add(in[0], a.ints[0], in[1], in[2], Scalar(scalar_or(a, 0, 1.0))); });
}

}  // namespace tessera::controller::detail
