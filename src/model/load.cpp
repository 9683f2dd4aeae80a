#include "model/load.h"

#include "model/presets.h"
#include "runtime/session.h"

namespace megakern {

LoadedDense load_dense(const std::string& name_or_path) {
  LoadedDense L;
  L.name = name_or_path;
  if (const DensePreset* p = find_dense_preset(name_or_path)) {
    L.image = make_dense_gguf(*p);
    L.file = GGUFFile::parse(L.image.data(), L.image.size(), p->name);
  } else {
    L.file = GGUFFile::open(resolve_model_path(name_or_path));
  }
  L.model = DenseModel::load(*L.file);
  return L;
}

}  // namespace megakern
