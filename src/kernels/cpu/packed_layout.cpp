#include "kernels/cpu/packed_layout.h"

#include <cstring>

#include "tensor/quant_blocks.h"

namespace moeserve::cpu {
namespace {

constexpr size_t kPlane = 4 * kPackRows;  // bytes: one dword per row

// Offsets of a row's bytes inside one packed block. `to_packed` copies row
// bytes into the packed block, otherwise back; `row` is one standard block.
struct Mover {
  uint8_t* packed;
  uint8_t* row;
  int lane;
  bool to_packed;
  // n bytes of the row at row_off <-> the packed block at packed_off.
  void move(size_t packed_off, size_t row_off, size_t n) const {
    uint8_t* p = packed + packed_off;
    if (to_packed) {
      std::memcpy(p, row + row_off, n);
    } else {
      std::memcpy(row + row_off, p, n);
    }
  }
  // One plane: the lane's dword <-> row bytes row_off..row_off+3.
  void plane(size_t plane_off, size_t row_off) const { move(plane_off + 4 * size_t(lane), row_off, 4); }
};

void move_q4_k(const Mover& m) {
  const size_t d = offsetof(BlockQ4_K, d), dmin = offsetof(BlockQ4_K, dmin);
  const size_t scales = offsetof(BlockQ4_K, scales), qs = offsetof(BlockQ4_K, qs);
  m.move(2 * size_t(m.lane), d, 2);
  m.move(2 * kPackRows + 2 * size_t(m.lane), dmin, 2);
  for (int p = 0; p < 3; ++p) m.plane(4 * kPackRows + kPlane * size_t(p), scales + 4 * size_t(p));
  const size_t qs0 = 4 * kPackRows + 3 * kPlane;
  for (int c = 0; c < 4; ++c) {
    for (int i = 0; i < 8; ++i) m.plane(qs0 + kPlane * size_t(8 * c + i), qs + size_t(32 * c + 4 * i));
  }
}

// Not a byte move: the 6-bit codes are regrouped (packed_layout.h), every
// bit kept, so unpacking restores any input bytes exactly.
void move_q6_k(const Mover& m) {
  // Byte offsets, not a BlockQ6_K*: rows of a strided source need not be aligned.
  uint8_t* ql = m.row + offsetof(BlockQ6_K, ql);
  uint8_t* qh = m.row + offsetof(BlockQ6_K, qh);
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      uint8_t* p = m.packed + 3 * kPlane * size_t(8 * h + l / 4) + 4 * size_t(m.lane) + size_t(l % 4);
      int codes[4] = {};
      if (m.to_packed) {
        q6_k_codes_at(ql + 64 * h, qh + 32 * h, l, codes);
        for (int t = 0; t < 3; ++t)
          p[kPlane * size_t(t)] = uint8_t(codes[t] | (((codes[3] >> (2 * t)) & 3) << 6));
      } else {
        for (int t = 0; t < 3; ++t) {
          codes[t] = p[kPlane * size_t(t)] & 63;
          codes[3] |= (p[kPlane * size_t(t)] >> 6) << (2 * t);
        }
        q6_k_store_codes_at(codes, ql + 64 * h, qh + 32 * h, l);
      }
    }
  }
  const size_t scales = offsetof(BlockQ6_K, scales), d = offsetof(BlockQ6_K, d);
  for (int s = 0; s < 16; ++s) m.move(48 * kPlane + 16 * size_t(s) + size_t(m.lane), scales + size_t(s), 1);
  m.move(52 * kPlane + 2 * size_t(m.lane), d, 2);
}

void move_rows(DType type, uint8_t* packed, uint8_t* rows, size_t row_stride, int64_t n_rows, int64_t n_cols,
               bool to_packed) {
  const size_t block = dtype_traits(type).block_bytes;
  const int64_t n_blocks = n_cols / dtype_block_elems(type);
  const size_t row_bytes = dtype_row_bytes(type, n_cols);
  for (int64_t g = 0; g < n_rows / kPackRows; ++g) {
    uint8_t* group = packed + size_t(g) * kPackRows * row_bytes;
    for (int lane = 0; lane < kPackRows; ++lane) {
      uint8_t* row = rows + size_t(g * kPackRows + lane) * row_stride;
      for (int64_t b = 0; b < n_blocks; ++b) {
        const Mover m{group + size_t(b) * kPackRows * block, row + size_t(b) * block, lane, to_packed};
        if (type == DType::Q4_K) {
          move_q4_k(m);
        } else {
          move_q6_k(m);
        }
      }
    }
  }
}

}  // namespace

bool has_packed_layout(DType type) { return type == DType::Q4_K || type == DType::Q6_K; }

void pack_rows(DType type, const void* src, size_t src_row_stride, void* dst, int64_t n_rows,
               int64_t n_cols) {
  move_rows(type, static_cast<uint8_t*>(dst), const_cast<uint8_t*>(static_cast<const uint8_t*>(src)),
            src_row_stride, n_rows, n_cols, true);
}

void unpack_rows(DType type, const void* src, void* dst, int64_t n_rows, int64_t n_cols) {
  move_rows(type, const_cast<uint8_t*>(static_cast<const uint8_t*>(src)), static_cast<uint8_t*>(dst),
            dtype_row_bytes(type, n_cols), n_rows, n_cols, false);
}

}  // namespace moeserve::cpu
