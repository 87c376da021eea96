// Pixels of one colour in a rendered image: what the chart and PNG tests count.
#pragma once

#include <cstdint>

#include "training/chart.h"

namespace meshcast::testing {

inline int pixels_of(const training::Image& img, std::uint32_t color) {
  int n = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) n += img.at(x, y) == color;
  return n;
}

}  // namespace meshcast::testing
