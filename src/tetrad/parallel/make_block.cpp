// make_block (block.hpp): the block of the model's family, by its description (a file of its
// own: block.hpp is below every block, each block includes it).
#include <memory>

#include "tetrad/parallel/block.hpp"
#include "tetrad/parallel/dense_block.hpp"
#include "tetrad/parallel/moe_block.hpp"

namespace tetrad::parallel {

std::unique_ptr<TransformerBlock> make_block(const BlockParts& parts) {
  if (parts.config.moe()) return std::make_unique<MoeBlock>(parts);
  return std::make_unique<DenseBlock>(parts);
}

}  // namespace tetrad::parallel
