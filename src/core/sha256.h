// SHA-256 of a byte buffer or a file (OpenSSL libcrypto), as lowercase hex: what
// `sha256sum` prints. Used to check shipped weight files before loading.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace megakern {

std::string sha256_hex(const uint8_t* data, size_t n);
// Throws megakern::Error if the file cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace megakern
