#include <tessera/comm/mpi/detail/process.hpp>

#include <tessera/comm/detail/reduce_kernels.hpp>
#include <tessera/comm/mpi/detail/mpi_impl.hpp>
#include <tessera/core/error.hpp>

namespace tessera::mpi::detail {

namespace {

template <DType D, ReduceOp R>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ::tessera::detail::reduce_pair(inout, in, *len, D, R);
}

template <DType D>
void create_user_ops(Process& p) {
  using Fn = void (*)(void*, void*, int*, MPI_Datatype*);
  std::array<Fn, kNumReduceOps> fns{};
  fns[static_cast<size_t>(ReduceOp::max)] = user_reduce<D, ReduceOp::max>;
  fns[static_cast<size_t>(ReduceOp::min)] = user_reduce<D, ReduceOp::min>;
  auto& row = p.ops[static_cast<size_t>(D)];
  for (const ReduceOp op : {ReduceOp::max, ReduceOp::min})
    MPI_Op_create(fns[static_cast<size_t>(op)], /*commute=*/1, &row[static_cast<size_t>(op)]);
}

}  // namespace

Process& process() {
  static Process p;
  return p;
}

void create_reduction_ops(Process& p) {
  if (p.ops_created) return;
  for (auto& row : p.ops) row.fill(MPI_OP_NULL);
  p.ops_created = true;
  create_user_ops<DType::f32>(p);
  create_user_ops<DType::f64>(p);
  create_user_ops<DType::f16>(p);
  create_user_ops<DType::bf16>(p);
}

void free_reduction_ops(Process& p) {
  for (auto& row : p.ops)
    for (MPI_Op& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  p.ops_created = false;
}

MPI_Op reduction(DType dtype, ReduceOp op) {
  const MPI_Op user = process().ops[static_cast<size_t>(dtype)][static_cast<size_t>(op)];
  if (user != MPI_OP_NULL) return user;
  TESSERA_ASSERT(dtype != DType::f16 && dtype != DType::bf16, name(op), " of ", name(dtype), " is staged in f32");
  if (dtype == DType::b8) return op == ReduceOp::product || op == ReduceOp::min ? MPI_LAND : MPI_LOR;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::product:
      return MPI_PROD;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

void set_errors_return(MPI_Comm comm) {
  locked([&] { return MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN); });
}

}  // namespace tessera::mpi::detail
