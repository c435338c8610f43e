// The C++ demo's pictures: an RGB canvas with lines and a colour map, written by libpng
// (Debian's libpng-dev). The Python demo (heat_unet_demo.py) draws its figures with matplotlib.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace demo {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes per pixel

  Image(int w, int h, uint8_t fill = 255) : width(w), height(h), rgb(static_cast<size_t>(w) * h * 3, fill) {}
  void set(int x, int y, uint8_t r, uint8_t g, uint8_t b);
  void line(int x0, int y0, int x1, int y1, uint8_t r, uint8_t g, uint8_t b);  // Bresenham
};

// Writes `image` to `path`; raises std::runtime_error when the file cannot be written.
void write_png(const Image& image, const std::string& path);

// A perceptual-ish colour map (dark blue -> cyan -> yellow -> dark red) for t in [0, 1].
void colour_map(double t, uint8_t* r, uint8_t* g, uint8_t* b);

}  // namespace demo
