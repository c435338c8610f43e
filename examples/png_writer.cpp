#include "png_writer.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace demo {

void Image::set(int x, int y, uint8_t r, uint8_t g, uint8_t b) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
  p[0] = r;
  p[1] = g;
  p[2] = b;
}

void Image::line(int x0, int y0, int x1, int y1, uint8_t r, uint8_t g, uint8_t b) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  while (true) {
    set(x0, y0, r, g, b);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void write_png(const Image& image, const std::string& path) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&png, path.c_str(), 0, image.rgb.data(), 0, nullptr))
    throw std::runtime_error("cannot write " + path + ": " + png.message);
}

void colour_map(double t, uint8_t* r, uint8_t* g, uint8_t* b) {
  t = std::min(1.0, std::max(0.0, t));
  static const double stops[][3] = {{0.05, 0.05, 0.35}, {0.0, 0.55, 0.85}, {0.95, 0.9, 0.2}, {0.6, 0.05, 0.05}};
  const double x = t * 3;
  const int i = std::min(2, static_cast<int>(x));
  const double f = x - i;
  auto mix = [&](int c) { return static_cast<uint8_t>(255 * (stops[i][c] * (1 - f) + stops[i + 1][c] * f)); };
  *r = mix(0);
  *g = mix(1);
  *b = mix(2);
}

}  // namespace demo
