#include <tessera/dtensor/sharded_op.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/dispatch.hpp>

namespace tessera {

void register_sharding(const std::string& op, const std::string& equation) {
  const FactorRule rule = [&] {
    try {
      return FactorRule::parse(equation);
    } catch (const ValueError& e) {
      // The parser's message, under the user's call: "[register_sharding] op 'f': equation ...".
      std::string_view why = e.what();
      if (why.starts_with('[')) why.remove_prefix(std::min(why.size(), why.find("] ") + 2));
      throw ValueError(detail::concat("[register_sharding] op '", op, "': ", why));
    }
  }();
  rule_registry().set(op, [rule, op](const std::vector<const Layout*>& inputs, const OpArgs&) {
    return factor_proposals(rule, inputs, op);
  });
}

void register_sharding(const std::string& op, ShardingRowsFn rows, OutputShapeFn output_shape) {
  TESSERA_CHECK(rows != nullptr, ValueError, "register_sharding", "empty rule for op '", op, "'");
  rule_registry().set(op, [rows = std::move(rows), output_shape = std::move(output_shape), op](
                              const std::vector<const Layout*>& inputs, const OpArgs&) {
    std::vector<Layout> given;
    std::vector<Shape> shapes;
    for (const auto* in : inputs) {
      given.push_back(*in);
      shapes.push_back(in->global_shape());
    }
    std::vector<ShardingRow> all{{Placements(inputs.size(), Replicate{}), Replicate{}}};
    for (auto& row : rows(given)) {
      TESSERA_CHECK(row.inputs.size() == inputs.size(), ShardingError, op, "a row of the rule of '", op, "' names ",
                    row.inputs.size(), " input placements for ", inputs.size(), " inputs: ", row.to_string());
      all.push_back(std::move(row));
    }
    const Shape out_shape = output_shape ? output_shape(shapes) : shapes.front();
    const MeshSpec& mesh = inputs.front()->mesh();
    std::vector<OpProposal> proposals;
    for (const auto& s : expand_rows(all, mesh.ndim())) {
      // A row the shapes cannot take (a shard dim out of range) is not a candidate.
      try {
        OpProposal p;
        for (size_t i = 0; i < inputs.size(); ++i) p.inputs.push_back(inputs[i]->with_placements(s.inputs[i]));
        p.output = Layout(out_shape, inputs.front()->dtype(), mesh, s.output);
        proposals.push_back(std::move(p));
      } catch (const ShardingError&) {
      }
    }
    return proposals;
  });
}

DTensor call_sharded(const std::string& op, const std::vector<DTensor>& inputs,
                     const std::function<Tensor(const std::vector<Tensor>&)>& kernel) {
  TESSERA_CHECK(!inputs.empty(), ValueError, op, "call_sharded needs at least one DTensor input");
  std::vector<const DTensor*> pointers;
  for (const auto& t : inputs) pointers.push_back(&t);
  const int id = rule_registry().id(op);
  return detail::dispatch(id, pointers, OpArgs{}, [&](std::span<const Tensor> locals, const detail::Decision& d) {
    Tensor out = kernel(std::vector<Tensor>(locals.begin(), locals.end()));
    TESSERA_CHECK(out.defined() && out.shape() == d.output_local_shape, ShardingError, op, "the kernel of '", op,
                  "' returned ", out.defined() ? out.shape().to_string() : std::string("(undefined)"),
                  " but this rank's block of ", d.output->to_string(), " is ", d.output_local_shape.to_string());
    return out;
  });
}

std::function<DTensor(const std::vector<DTensor>&)> local_map(std::function<Tensor(const std::vector<Tensor>&)> fn,
                                                              std::vector<std::optional<Placements>> in_placements,
                                                              Placements out_placements, bool redistribute_inputs) {
  return [fn = std::move(fn), in_placements = std::move(in_placements), out_placements = std::move(out_placements),
          redistribute_inputs](const std::vector<DTensor>& inputs) {
    TESSERA_CHECK(inputs.size() == in_placements.size(), ShardingError, "local_map", "got ", inputs.size(),
                  " inputs for ", in_placements.size(), " declared placements");
    TESSERA_CHECK(!inputs.empty(), ShardingError, "local_map", "needs at least one DTensor input");
    const DeviceMesh& mesh = inputs.front().device_mesh();
    std::vector<Tensor> locals;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const DTensor& x = inputs[i];
      TESSERA_CHECK(x.layout().mesh() == mesh.spec(), ShardingError, "local_map", "input ", i, " lives on ",
                    x.device_mesh().to_string(), ", input 0 on ", mesh.to_string());
      const auto& want = in_placements[i];
      if (!want || *want == x.placements()) {
        locals.push_back(x.to_local());
        continue;
      }
      TESSERA_CHECK(redistribute_inputs, ShardingError, "local_map", "input ", i, " is ", x.layout().to_string(),
                    " but the function takes ", to_string(*want), "; pass redistribute_inputs = true to move it");
      locals.push_back(x.redistribute(*want).to_local());
    }
    TESSERA_CHECK(static_cast<int64_t>(out_placements.size()) == mesh.ndim(), ShardingError, "local_map",
                  "out_placements ", to_string(out_placements), " has ", out_placements.size(), " entries for ",
                  mesh.to_string());
    // The pieces of a sharded output are whatever fn returned on each rank: take their sizes
    // from the locals (one small all_gather of shapes), never assume the even split, which
    // uneven inputs would break (ranks would disagree about the global shape).
    FromLocalOptions options;
    options.infer_sizes = std::any_of(out_placements.begin(), out_placements.end(),
                                      [](const Placement& p) { return is_shard(p); });
    return DTensor::from_local(fn(locals), mesh, out_placements, options);
  };
}

}  // namespace tessera
