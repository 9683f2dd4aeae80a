// SHA-256 through OpenSSL's libcrypto (EVP digests).
#include "core/sha256.h"

#include <openssl/evp.h>

#include <fstream>
#include <memory>
#include <vector>

#include "core/error.h"

namespace megakern {

namespace {

struct DigestDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using Digest = std::unique_ptr<EVP_MD_CTX, DigestDeleter>;

Digest start() {
  Digest c(EVP_MD_CTX_new());
  if (!c || EVP_DigestInit_ex(c.get(), EVP_sha256(), nullptr) != 1) fail("sha256: libcrypto could not start a digest");
  return c;
}

void update(EVP_MD_CTX* c, const void* data, size_t n) {
  if (EVP_DigestUpdate(c, data, n) != 1) fail("sha256: libcrypto digest update failed");
}

std::string finish(EVP_MD_CTX* c) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(c, md, &len) != 1) fail("sha256: libcrypto digest final failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

}  // namespace

std::string sha256_hex(const uint8_t* data, size_t n) {
  Digest c = start();
  update(c.get(), data, n);
  return finish(c.get());
}

std::string sha256_file_hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {} to check its sha256", path);
  Digest c = start();
  std::vector<char> chunk(1 << 16);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    update(c.get(), chunk.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) fail("reading {} failed while checking its sha256", path);
  return finish(c.get());
}

}  // namespace megakern
