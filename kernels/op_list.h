// The op list: every op of the trainer, once. Each entry is
//
//   TRAINER_OP(route, return type, name, (parameters), (arguments))
//
// and the file is included, with TRAINER_OP defined for the purpose, by
//   kernels/ops.h              the public declarations, trainer::ops
//   kernels/cpu/cpu_ops.h      the CPU backend's, trainer::cpu
//   kernels/cuda/cuda_ops.h    the CUDA backend's, trainer::cuda
//   kernels/cuda_ops_table.h   the CUDA module's ops table (a pointer per op)
//                              and the signature hash a stale module is refused by
//   kernels/checks/op_checks.h the shared argument checks, trainer::op_checks
//   kernels/ops.cpp            the router: ops::name = checks, then backend
// so a signature cannot differ between them. Adding an op means one entry
// here and one definition in each of kernels/checks, kernels/cpu and
// kernels/cuda (the linker names any that is missing; a CUDA one when it
// links bench_kernels, which links the module, and when the module loads).
//
// route:
//   device    every present tensor must be on one device, that of the first
//             present tensor (an absent Tensor{} has no data and is skipped;
//             a list of tensors counts as its elements in order; with none
//             present: the CPU). The op runs on that device's backend.
//   transfer  (dst, src) on different devices: the bytes move between host
//             and device (core/device_memory.h), same dtype; otherwise as
//             `device`.
//
// Conventions
//   N = tokens in a micro-batch (B*T), C = channels, V = vocabulary.
//   Parameter gradients accumulate (+=) across micro-batches.
//   Activation gradients overwrite, except where marked (+=): the inputs of
//   norms are the residual stream, whose gradient is a sum.
//   An "empty" Tensor (data == nullptr) means "absent" where allowed; a
//   tensor with no elements may have no data (an expert or a rank can get
//   zero rows).
//   The math of every op is written out in docs/MODEL_MATH.md, which the
//   PyTorch reference also follows.
//
// No include guard: each includer defines TRAINER_OP and includes this once.

// ---- elementwise and memory -------------------------------------------------
TRAINER_OP(device, void, fill, (Tensor t, float value), (t, value))
// Same numel and dtype (any dtype, ids included); dst may overlap src.
TRAINER_OP(transfer, void, copy, (Tensor dst, Tensor src), (dst, src))
// out = a + b; same numel; out may alias a or b.
TRAINER_OP(device, void, add, (Tensor out, Tensor a, Tensor b), (out, a, b))
// acc += x; same numel.
TRAINER_OP(device, void, add_inplace, (Tensor acc, Tensor x), (acc, x))
TRAINER_OP(device, void, scale_inplace, (Tensor t, float s), (t, s))
// dst = src converted to dst's dtype (F32/BF16/F16); same numel. Also moves
// bytes between host and device when the devices differ (same dtype then).
TRAINER_OP(transfer, void, convert, (Tensor dst, Tensor src), (dst, src))

// ---- reductions -------------------------------------------------------------
// Sum of x^2 in double (NaN propagates).
TRAINER_OP(device, double, sum_squares, (Tensor x), (x))
// Sum in double (losses, aux terms).
TRAINER_OP(device, double, sum, (Tensor x), (x))
// A 64-bit checksum of x's bytes, any dtype (kernels/checksum_math.h): over
// the little-endian 32-bit words w_i of the bytes (the last one zero-padded),
// mix(sum_i term(w_i, i) mod 2^64, bytes). A sum of integers, so every backend,
// thread count and launch shape gives the same value; one flipped bit changes
// it but with probability 2^-64. The replica check compares it across ranks.
TRAINER_OP(device, uint64_t, checksum, (Tensor x), (x))

// ---- embedding --------------------------------------------------------------
// A vocabulary-parallel table (tensor parallelism): `table` holds the rows of
// ids [row_offset, row_offset + table.dim(0)) of a vocabulary of vocab_size
// ids; the last rank's table may end in padding rows that no valid id reaches.
// row_offset = 0, vocab_size = table.dim(0) is the whole table. row_offset
// >= 0, vocab_size >= 1; every id must lie in [0, vocab_size) (the CPU
// refuses the call before writing anything; CUDA writes NaN rows in the
// forward and skips the id in the backward).
//
// out[n,:] (= or +=) table[ids[n] - row_offset,:] for the ids this table
// holds; for the others out[n,:] = 0 (accumulate = false) or is left as it
// is (accumulate = true), so the sum over the ranks is the whole lookup.
// ids [N] (or [B,T]) I32, table [rows,C], out [..., C] with N*C elements.
TRAINER_OP(device, void, embedding_forward,
           (Tensor out, Tensor ids, Tensor table, bool accumulate, int64_t row_offset,
            int64_t vocab_size),
           (out, ids, table, accumulate, row_offset, vocab_size))
// dtable[ids[n] - row_offset,:] += dout[n,:] for the ids this table holds
// (the others are skipped); each row sums its tokens in token order (CUDA
// too: deterministic), so a rank's rows equal those rows of the whole
// table's backward bit for bit.
TRAINER_OP(device, void, embedding_backward,
           (Tensor dtable, Tensor ids, Tensor dout, int64_t row_offset, int64_t vocab_size),
           (dtable, ids, dout, row_offset, vocab_size))

// ---- normalization ----------------------------------------------------------
// out = x * rstd * weight, rstd[n] = 1/sqrt(mean(x[n]^2) + eps). x,out [N,C],
// rstd [N] F32.
TRAINER_OP(device, void, rmsnorm_forward,
           (Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps),
           (out, rstd, x, weight, eps))
// dx (+=), dweight (+=)
TRAINER_OP(device, void, rmsnorm_backward,
           (Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd),
           (dx, dweight, dout, x, weight, rstd))
// out = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + eps) (biased
// var); bias may be empty. mean, rstd [N] F32.
TRAINER_OP(device, void, layernorm_forward,
           (Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias, float eps),
           (out, mean, rstd, x, weight, bias, eps))
// dx (+=), dweight (+=), dbias (+=, may be empty)
TRAINER_OP(device, void, layernorm_backward,
           (Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x, Tensor weight,
            Tensor mean, Tensor rstd),
           (dx, dweight, dbias, dout, x, weight, mean, rstd))

// ---- linear -----------------------------------------------------------------
// out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] (bias may be empty).
TRAINER_OP(device, void, linear_forward, (Tensor out, Tensor inp, Tensor weight, Tensor bias),
           (out, inp, weight, bias))
// dinp = dout @ weight (overwrite, or += if accumulate_dinp; may be empty = skip)
// dweight += dout^T @ inp (may be empty = skip: a frozen weight, or a
// grouped GEMM that only wants dinp); dbias += column sums of dout (may be empty).
TRAINER_OP(device, void, linear_backward,
           (Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
            bool accumulate_dinp),
           (dinp, dweight, dbias, dout, inp, weight, accumulate_dinp))

// ---- rotary position embedding ---------------------------------------------
// x [B,T,H,D], half-split pairs (x[i], x[i+D/2]) for i < D/2 rotated by
// angle = p * inv_freq[i] at position p = pos_offset + t, t = 0..T-1, with
// inv_freq = rope_inv_freqs(D, rope) (kernels/rope_freqs.h: theta^(-2i/D),
// or its linear / llama3 scaling): a chunk of a longer sequence (context
// parallelism) starts at pos_offset >= 0, and gets bit for bit the rotation
// of those positions in the whole sequence. out may alias inp. A bare theta
// converts to an unscaled Rope.
TRAINER_OP(device, void, rope_forward, (Tensor out, Tensor inp, const Rope& rope, int64_t pos_offset),
           (out, inp, rope, pos_offset))
// inverse rotation of dout; dinp may alias dout.
TRAINER_OP(device, void, rope_backward,
           (Tensor dinp, Tensor dout, const Rope& rope, int64_t pos_offset),
           (dinp, dout, rope, pos_offset))
// Rotary embedding at explicit positions (context parallelism: a rank's zigzag
// chunks are not one contiguous range; key/value-cache decoding; separate
// documents, where positions restart at each document): row t of batch row b
// is rotated as rope_forward rotates position pos[t], or pos[b, t] when pos is
// [B, T] (one position per token). pos [T] or [B,T] I32, any values; with
// pos = offset..offset+T-1 the result is bit for bit rope_forward(out, inp,
// rope, offset), on each backend. out may alias inp.
TRAINER_OP(device, void, rope_forward_pos, (Tensor out, Tensor inp, const Rope& rope, Tensor pos),
           (out, inp, rope, pos))
// inverse rotation of dout at positions pos; dinp may alias dout.
TRAINER_OP(device, void, rope_backward_pos, (Tensor dinp, Tensor dout, const Rope& rope, Tensor pos),
           (dinp, dout, rope, pos))

// ---- attention --------------------------------------------------------------
// q [B,T,Hq,D], k,v [B,T,Hkv,D], Hq % Hkv == 0; query head h reads kv head
// h / (Hq/Hkv). scale = 1/sqrt(D). out [B,T,Hq,D].
// lse [B,Hq,T] F32: log-sum-exp of the scaled (masked) scores, saved for backward.
// window W >= 0 (sliding-window attention, model.sliding_window): 0 = none;
// W > 0 needs causal and also masks keys more than W positions back: query i
// sees keys max(0, i - W) .. i, W + 1 of them counting itself (the rule of
// transformers 4.40's Mistral eager/sdpa mask, docs/MODEL_MATH.md). Work is
// O(T W): key blocks wholly outside the band are never touched.
// doc_start [B,T] I32 (separate documents, data.documents; empty: none)
// needs causal: query i of sequence b also sees no key before
// doc_start[b,i], the position where its document starts (0 <= doc_start[b,i]
// <= i, non-decreasing in i; a larger value is taken as i). As with the
// window, key blocks before a block's documents are never touched.
TRAINER_OP(device, void, attention_forward,
           (Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool causal, int64_t window,
            Tensor doc_start),
           (out, lse, q, k, v, causal, window, doc_start))
// dq, dk, dv overwrite; probabilities are recomputed from lse.
TRAINER_OP(device, void, attention_backward,
           (Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
            Tensor lse, bool causal, int64_t window, Tensor doc_start),
           (dq, dk, dv, dout, q, k, v, out, lse, causal, window, doc_start))

// ---- attention at explicit positions (ring attention, context parallelism) --
// A cp rank holds a sequence's chunks r and 2cp-1-r (zigzag); K/V blocks go
// round the ring and each rank merges partial attentions of its queries
// against every block. Positions are I32 global token positions, the same for
// every batch row; key j is visible to query i iff k_pos[j] <= q_pos[i] and,
// with a window W > 0, q_pos[i] - k_pos[j] <= W (W = 0: no window; the rule of
// attention_forward's window, by position).
//
// q [B,Tq,Hq,D], k,v [B,Tk,Hkv,D], Hq % Hkv == 0, query head h reads kv head
// h / (Hq/Hkv); q_pos [Tq], k_pos [Tk] I32; scale = 1/sqrt(D).
// q_doc_start [B,Tq] I32 (separate documents; empty: none): query row i of
// sequence b also sees no key at a position before q_doc_start[b,i] (the
// position its document starts at; non-decreasing along each of the rows'
// runs of consecutive positions). out
// [B,Tq,Hq,D] = softmax over the visible keys times v; lse [B,Hq,Tq] F32 =
// log-sum-exp of the scaled visible scores (as attention_forward's). A query
// row that sees no key gets out = 0, lse = -inf. With q_pos = k_pos = 0..T-1
// this is attention_forward(causal = true, window) (CPU: bit for bit).
TRAINER_OP(device, void, attention_forward_pos,
           (Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor q_pos, Tensor k_pos,
            int64_t window, Tensor q_doc_start),
           (out, lse, q, k, v, q_pos, k_pos, window, q_doc_start))
// Merges a partial result into the running one, in place, per query row:
//   lse' = logaddexp(lse, part_lse),
//   out  = out * exp(lse - lse') + part_out * exp(part_lse - lse'), lse = lse'.
// A side at -inf weighs 0 and its out is not read; both -inf (no key seen
// yet): out = 0, lse = -inf. A NaN lse makes the row NaN. out, part_out [B,T,H,D] (same shape); lse, part_lse [B,H,T] F32. The
// ring starts from out = 0, lse = -inf; merging into that copies the part.
TRAINER_OP(device, void, attention_merge,
           (Tensor out, Tensor lse, Tensor part_out, Tensor part_lse),
           (out, lse, part_out, part_lse))
// One K/V block's share of the attention gradient, ACCUMULATED (+=) into dq
// [B,Tq,Hq,D], dk and dv [B,Tk,Hkv,D], given the FINAL (merged over every
// block) out and lse of the queries. P_ij = exp(scale s_ij - lse_i) for
// visible keys, else 0; D_i = dout_i . out_i; dS = P (dout v^T - D);
// dq += scale dS k, dk += scale dS^T q, dv += P^T dout (dk, dv summed over
// the query heads sharing a kv head). Rows with lse = -inf add nothing. The
// sum is added in the storage type (a BF16 accumulator rounds once per call).
// Summed over all blocks: attention_backward of the whole (CPU, identity
// positions, one block: bit for bit attention_backward into zeroed buffers).
TRAINER_OP(device, void, attention_backward_pos,
           (Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
            Tensor lse, Tensor q_pos, Tensor k_pos, int64_t window, Tensor q_doc_start),
           (dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, window, q_doc_start))

// ---- activations ------------------------------------------------------------
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
TRAINER_OP(device, void, gelu_forward, (Tensor out, Tensor inp), (out, inp))
// dinp may alias dout.
TRAINER_OP(device, void, gelu_backward, (Tensor dinp, Tensor dout, Tensor inp),
           (dinp, dout, inp))
// out = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
TRAINER_OP(device, void, swiglu_forward, (Tensor out, Tensor gate, Tensor up), (out, gate, up))
TRAINER_OP(device, void, swiglu_backward,
           (Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up),
           (dgate, dup, dout, gate, up))

// ---- loss -------------------------------------------------------------------
// logits [N,V], targets [N] I32 (target < 0: ignored, loss 0, gradient 0).
// losses[n] = logsumexp(logits[n]) - logits[n, target[n]], losses [N] F32.
// If dlogits is non-empty: dlogits = (softmax(logits) - onehot(target)) * grad_scale.
// dlogits may alias logits: no probability tensor is ever stored.
TRAINER_OP(device, void, cross_entropy_forward_backward,
           (Tensor losses, Tensor dlogits, Tensor logits, Tensor targets, float grad_scale),
           (losses, dlogits, logits, targets, grad_scale))

// Vocabulary-parallel cross-entropy (Megatron style), in two steps around an
// all-gather of [N, 3] statistics per rank instead of [N, V] logits.
//
// Step 1, on every rank: logits [N, Vl] hold the columns of vocabulary ids
// [vocab_offset, vocab_offset + Vl), of which only the first valid_cols
// (0 <= valid_cols <= Vl) are real; the rest is padding and never read.
// stats [N, 3] F32, per row:
//   m = max of the valid logits (-inf when valid_cols == 0),
//   s = sum over the valid logits of exp(logit - m) (0 when none, or when
//       every valid logit is -inf),
//   t = logit[target - vocab_offset] if this rank holds the target, else 0.
// targets [N] I32: target < 0 is ignored (t = 0); every target must be
// < vocab_size (the CPU refuses the call; CUDA sets t = NaN, so the loss is
// NaN). vocab_offset >= 0; real columns are vocabulary ids (vocab_offset +
// valid_cols <= vocab_size when valid_cols > 0; a padding-only rank may
// start past the vocabulary).
TRAINER_OP(device, void, cross_entropy_partial_stats,
           (Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset, int64_t valid_cols,
            int64_t vocab_size),
           (stats, logits, targets, vocab_offset, valid_cols, vocab_size))
// Step 2, on every rank, with all_stats [P, N, 3] F32 = the stats of the P
// ranks in rank order (P >= 1). Per row, in double:
//   M = max_p m_p, lse = M + log(sum_p s_p exp(m_p - M)) (ranks with s_p = 0
//   left out), target logit = sum_p t_p,
//   losses[n] = lse - target logit (0 for ignored targets), losses [N] F32.
// If dlogits is non-empty ([N, Vl], like logits): dlogits = (softmax -
// onehot(target)) * grad_scale over this rank's valid columns, the target
// column (if held here) as (exp(target logit - lse) - 1) * grad_scale in
// double; padding columns and ignored rows 0. dlogits may alias logits (the
// very same tensor). No probability in any rank (every logit -inf) or a NaN
// target logit gives a NaN loss and gradient row. With P = 1, vocab_offset =
// 0, valid_cols = V the pair is cross_entropy_forward_backward up to float
// rounding (s is stored in fp32).
TRAINER_OP(device, void, cross_entropy_vocab_parallel,
           (Tensor losses, Tensor dlogits, Tensor logits, Tensor targets, Tensor all_stats,
            int64_t vocab_offset, int64_t valid_cols, float grad_scale),
           (losses, dlogits, logits, targets, all_stats, vocab_offset, valid_cols, grad_scale))

// ---- mixture of experts: routing -------------------------------------------
// Router: probs = softmax(logits) [N,E] F32; topk_idx [N,K] I32 = the K
// largest probabilities per token in descending order (ties: lower expert
// index first); topk_w [N,K] F32 = those probabilities, divided by their sum
// when normalize is true.
TRAINER_OP(device, void, moe_route_forward,
           (Tensor probs, Tensor topk_idx, Tensor topk_w, Tensor logits, bool normalize),
           (probs, topk_idx, topk_w, logits, normalize))
// Router statistics of a micro-batch's tokens, stats [2,E] F32 (overwrite):
//   stats[0,e] = assignments in topk_idx to expert e (before any capacity drop),
//   stats[1,e] = sum_n probs[n,e].
// Sums over tokens, so the ranks that split a sequence (context parallelism)
// add theirs to get the whole micro-batch's (model/router_stats.h).
TRAINER_OP(device, void, moe_router_stats, (Tensor stats, Tensor probs, Tensor topk_idx),
           (stats, probs, topk_idx))
// Load-balancing loss (Switch/GShard form, written to aux[0], one F32) of the
// `tokens` tokens the statistics cover, each with `topk` assignments:
//   aux = E * sum_e f_e * P_e,  f_e = stats[0,e] / (tokens*topk),
//   P_e = stats[1,e] / tokens.  f_e is a constant for the gradient.
TRAINER_OP(device, void, moe_aux_loss_forward, (Tensor aux, Tensor stats, int tokens, int topk),
           (aux, stats, tokens, topk))
// dlogits [N,E] overwrite, from dtopk_w [N,K] (the gradient of the combine
// weights; may be empty: only the aux term) and aux_grad (= d loss / d aux,
// e.g. coefficient * grad scale): d aux / d probs[n,e] = E * f_e / tokens,
// f_e from stats as in moe_aux_loss_forward (stats and tokens are only read
// when aux_grad != 0; stats may then be empty).
TRAINER_OP(device, void, moe_route_backward,
           (Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor topk_w,
            bool normalize, float aux_grad, Tensor stats, int tokens),
           (dlogits, dtopk_w, probs, topk_idx, topk_w, normalize, aux_grad, stats, tokens))
// Dispatch plan with capacity. Assignments are admitted k-major (every token's
// first choice before any second choice), tokens in order within a k, while
// the expert has fewer than `capacity` rows (capacity <= 0: dropless).
// admitted [N,K] I32 (may be empty): an assignment whose entry is < 0 is
// dropped before the capacity counts (the admission already decided over a
// whole sequence split across ranks: model/router_stats.h).
// row_map [N,K] I32: row of the assignment in the permuted buffer, -1 if dropped.
// offsets [E+1] I32: rows of expert e are [offsets[e], offsets[e+1]); offsets[E] = kept total.
TRAINER_OP(device, void, moe_dispatch_plan,
           (Tensor row_map, Tensor offsets, Tensor topk_idx, int num_experts, int capacity, Tensor admitted),
           (row_map, offsets, topk_idx, num_experts, capacity, admitted))

// ---- mixture of experts: permutation ---------------------------------------
// xp[row_map[n,k],:] = x[n,:]; rows >= offsets[E] are zeroed. xp [N*K,C].
TRAINER_OP(device, void, moe_permute, (Tensor xp, Tensor x, Tensor row_map), (xp, x, row_map))
// dx[n,:] (+=) sum_k dxp[row_map[n,k],:] over kept assignments.
TRAINER_OP(device, void, moe_permute_backward, (Tensor dx, Tensor dxp, Tensor row_map),
           (dx, dxp, row_map))
// y[n,:] = sum over kept k of topk_w[n,k] * yp[row_map[n,k],:] (overwrite).
TRAINER_OP(device, void, moe_unpermute, (Tensor y, Tensor yp, Tensor row_map, Tensor topk_w),
           (y, yp, row_map, topk_w))
// dyp[row,:] = topk_w[n,k] * dy[n,:] for kept rows, 0 elsewhere;
// dtopk_w[n,k] = dot(dy[n,:], yp[row,:]) for kept, 0 for dropped (may be empty).
TRAINER_OP(device, void, moe_unpermute_backward,
           (Tensor dyp, Tensor dtopk_w, Tensor dy, Tensor yp, Tensor row_map, Tensor topk_w),
           (dyp, dtopk_w, dy, yp, row_map, topk_w))

// ---- mixture of experts: grouped linear ------------------------------------
// Per-expert linear over row groups: for rows r in [offsets[e], offsets[e+1]),
// out[r,:] = inp[r,:] @ weight[e]^T. weight [E,OC,IC]; rows >= offsets[E] zeroed.
TRAINER_OP(device, void, grouped_linear_forward,
           (Tensor out, Tensor inp, Tensor weight, Tensor offsets), (out, inp, weight, offsets))
// dinp overwrite (rows >= offsets[E] zeroed), dweight (+=); either may be empty.
TRAINER_OP(device, void, grouped_linear_backward,
           (Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor offsets),
           (dinp, dweight, dout, inp, weight, offsets))

// ---- optimizer (AdamWStep: kernels/ops.h) -----------------------------------
// PyTorch AdamW order: p *= 1 - lr*wd; m,v updated;
// p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps). param, m, v F32.
TRAINER_OP(device, void, adamw_update, (Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWStep& s),
           (param, grad, m, v, s))
// Mixed precision: the update runs on the fp32 master copy (same order as
// adamw_update) and writes the rounded result into param (BF16/F16/F32), in
// one pass; grad may be BF16/F16/F32.
TRAINER_OP(device, void, adamw_update_master,
           (Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v, const AdamWStep& s),
           (param, master, grad, m, v, s))
// The update of a whole list of tensors at once, for every i:
//   adamw_update_master(params[i], masters[i], grads[i], ms[i], vs[i], s with
//   weight_decay = weight_decays[i])   (s.weight_decay is not used)
// with bit-identical results. params[i] may be masters[i] itself (F32): that
// is adamw_update of masters[i]. All lists have one entry per tensor; tensors
// without elements are skipped; no two arrays of the call may overlap. The
// CUDA backend runs it in one launch per (param dtype, grad dtype) pair
// present (usually one) instead of one per tensor; the CPU runs the list in
// order.
TRAINER_OP(device, void, adamw_update_master_multi,
           (const std::vector<Tensor>& params, const std::vector<Tensor>& masters,
            const std::vector<Tensor>& grads, const std::vector<Tensor>& ms,
            const std::vector<Tensor>& vs, const std::vector<float>& weight_decays,
            const AdamWStep& s),
           (params, masters, grads, ms, vs, weight_decays, s))
