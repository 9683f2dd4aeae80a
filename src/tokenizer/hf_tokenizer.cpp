#include "tokenizer/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tiktoken.h"

namespace megakern {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The Split regexes of the recipes tokenizer.json spells as a Split
// pre-tokenizer, as Hugging Face writes them (case-insensitive group for the
// contractions); pretokenizer.cpp holds the equivalent PCRE2 patterns.
constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string describe(const Json& j) {
  std::string text = j.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return fmt::format("{} {}", j.type_name(), text);
}

std::string strip_exception_tag(const char* what) {
  std::string_view s(what);
  if (s.starts_with("[json.exception.")) {
    const size_t close = s.find("] ");
    if (close != std::string_view::npos) s.remove_prefix(close + 2);
  }
  return std::string(s);
}

// Parses a JSON object file; nullopt when it does not exist.
std::optional<Json> read_json(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open file", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    fail("{}: not valid JSON: {}", path.string(), strip_exception_tag(e.what()));
  }
  if (!j.is_object()) fail("{}: must be a JSON object, got {}", path.string(), describe(j));
  return j;
}

// A field that must be an object (or absent/null when optional).
const Json* field(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

bool bool_field(const Json& obj, const char* key, bool def, const std::string& file, const std::string& where) {
  const Json* v = field(obj, key);
  if (!v) return def;
  if (!v->is_boolean()) fail("{}: '{}{}' must be a boolean, got {}", file, where, key, describe(*v));
  return v->get<bool>();
}

// Checks a ByteLevel pre-tokenizer and returns its use_regex flag.
bool byte_level_use_regex(const Json& p, const std::string& file, const std::string& where) {
  if (bool_field(p, "add_prefix_space", false, file, where))
    fail("{}: '{}add_prefix_space' is true; a prefix space is not supported", file, where);
  return bool_field(p, "use_regex", true, file, where);
}

std::string type_of(const Json& p, const std::string& file, const std::string& where) {
  if (!p.is_object()) fail("{}: '{}' must be an object, got {}", file, where, describe(p));
  const Json* t = field(p, "type");
  if (!t || !t->is_string()) fail("{}: '{}type' must be a string", file, where);
  return t->get<std::string>();
}

// Recognises the pre_tokenizer as one of the named recipes.
std::string recognise_pre_tokenizer(const Json& tj, const std::string& file) {
  const Json* pre = field(tj, "pre_tokenizer");
  if (!pre) fail("{}: 'pre_tokenizer' is missing; a byte-level BPE tokenizer needs a ByteLevel pre-tokenizer", file);
  const std::string type = type_of(*pre, file, "pre_tokenizer.");
  if (type == "ByteLevel") {
    if (!byte_level_use_regex(*pre, file, "pre_tokenizer."))
      fail("{}: 'pre_tokenizer' is ByteLevel without use_regex, which splits nothing; not supported", file);
    return "gpt2";
  }
  if (type != "Sequence")
    fail("{}: 'pre_tokenizer.type' is '{}'; supported: ByteLevel, or a Sequence of Digits or Split(Regex) and ByteLevel",
         file, type);
  const Json* seq = field(*pre, "pretokenizers");
  if (!seq || !seq->is_array() || seq->size() != 2)
    fail("{}: 'pre_tokenizer.pretokenizers' must be a list of two pre-tokenizers (Digits or Split, then ByteLevel)",
         file);
  const std::string first = type_of((*seq)[0], file, "pre_tokenizer.pretokenizers[0].");
  const std::string second = type_of((*seq)[1], file, "pre_tokenizer.pretokenizers[1].");
  if (second != "ByteLevel")
    fail("{}: 'pre_tokenizer.pretokenizers[1].type' is '{}', expected ByteLevel", file, second);
  const bool regex = byte_level_use_regex((*seq)[1], file, "pre_tokenizer.pretokenizers[1].");
  const Json& p0 = (*seq)[0];
  if (first == "Digits") {
    if (!bool_field(p0, "individual_digits", false, file, "pre_tokenizer.pretokenizers[0]."))
      fail("{}: 'pre_tokenizer.pretokenizers[0]' is Digits without individual_digits; not supported", file);
    if (!regex)
      fail("{}: 'pre_tokenizer.pretokenizers[1].use_regex' is false after Digits; not supported", file);
    return "smollm";
  }
  if (first == "Split") {
    if (regex)
      fail("{}: 'pre_tokenizer.pretokenizers[1].use_regex' is true after a Split; not supported", file);
    const Json* pat = field(p0, "pattern");
    const Json* rx = pat && pat->is_object() ? field(*pat, "Regex") : nullptr;
    if (!rx || !rx->is_string())
      fail("{}: 'pre_tokenizer.pretokenizers[0].pattern' must be {{\"Regex\": \"...\"}}", file);
    const Json* behavior = field(p0, "behavior");
    if (!behavior || *behavior != "Isolated")
      fail("{}: 'pre_tokenizer.pretokenizers[0].behavior' must be \"Isolated\"", file);
    if (bool_field(p0, "invert", false, file, "pre_tokenizer.pretokenizers[0]."))
      fail("{}: 'pre_tokenizer.pretokenizers[0].invert' is true; not supported", file);
    const std::string r = rx->get<std::string>();
    if (r == kLlama3Split) return "llama3";
    if (r == kQwen2Split) return "qwen2";
    fail("{}: 'pre_tokenizer.pretokenizers[0].pattern.Regex' is not a split this engine knows (supported: the "
         "Llama 3 and Qwen 2 splits): {}",
         file, r.size() > 120 ? r.substr(0, 117) + "..." : r);
  }
  fail("{}: 'pre_tokenizer.pretokenizers[0].type' is '{}'; supported: Digits, Split", file, first);
}

// An id field of tokenizer_config.json: a token string, {"content": ...} or null.
int32_t token_field(const Json& cfg, const char* key, const Vocab& v,
                    const std::unordered_map<std::string, int32_t>& ids, const std::string& file) {
  const Json* t = field(cfg, key);
  if (!t) return -1;
  const Json* s = t;
  if (t->is_object()) s = field(*t, "content");
  if (!s || !s->is_string())
    fail("{}: '{}' must be a token string or {{\"content\": ...}}, got {}", file, key, describe(*t));
  const auto it = ids.find(s->get<std::string>());
  if (it == ids.end()) fail("{}: '{}' is \"{}\", which is not a token of the vocabulary", file, key, s->get<std::string>());
  (void)v;
  return it->second;
}

// tokenizer_config.json's chat_template, when it has one.
void read_chat_template(const Json& cfg, const std::string& cfile, HFTokenizerFiles& out) {
  if (const Json* ct = field(cfg, "chat_template")) {
    if (!ct->is_string()) fail("{}: 'chat_template' must be a string, got {}", cfile, describe(*ct));
    out.chat_template = ct->get<std::string>();
  }
}

// What every checkpoint tokenizer takes from the directory besides its own
// files: chat_template.jinja (when tokenizer_config.json has no template) and
// generation_config.json's eos_token_id (one id or a list), which ends generation.
void finish_directory(const fs::path& root, HFTokenizerFiles& out) {
  Vocab& v = out.vocab;
  if (!out.chat_template) {
    const fs::path jinja = root / "chat_template.jinja";
    std::error_code ec;
    if (fs::exists(jinja, ec)) {
      std::ifstream in(jinja, std::ios::binary);
      if (!in) fail("{}: cannot open file", jinja.string());
      std::stringstream ss;
      ss << in.rdbuf();
      out.chat_template = ss.str();
    }
  }
  const fs::path gpath = root / "generation_config.json";
  if (const std::optional<Json> gen = read_json(gpath)) {
    if (const Json* e = field(*gen, "eos_token_id")) {
      std::vector<Json> list = e->is_array() ? e->get<std::vector<Json>>() : std::vector<Json>{*e};
      for (size_t i = 0; i < list.size(); ++i) {
        const Json& x = list[i];
        if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
            x.get<int64_t>() >= static_cast<int64_t>(v.tokens.size()))
          fail("{}: 'eos_token_id' holds {}, not an id of the {} tokens", gpath.string(), describe(x), v.tokens.size());
        const int32_t id = static_cast<int32_t>(x.get<int64_t>());
        if (v.eos_id < 0) v.eos_id = id;
        else if (id != v.eos_id) v.extra_eog_ids.push_back(id);
      }
    }
  }
}

// A tiktoken rank file with the files the Kimi checkpoints ship beside it,
// read as their published loader reads them: the split pattern is the
// "|".join([...]) assigned to pat_str in class TikTokenTokenizer of the
// tokenizer source, and the 256 ids after the ranks are special tokens, named
// by tokenizer_config.json's added_tokens_decoder or "<|reserved_token_{id}|>".
constexpr int kTiktokenReserved = 256;

HFTokenizerFiles load_tiktoken_files(const fs::path& root) {
  const std::string rfile = (root / "tiktoken.model").string();
  const fs::path cpath = root / "tokenizer_config.json";
  const std::string cfile = cpath.string();
  const std::optional<Json> cfg = read_json(cpath);
  if (!cfg) fail("{}: file is missing; a tiktoken.model tokenizer takes its special tokens from it", cfile);
  const std::vector<std::string> ranks = read_tiktoken_ranks(rfile);

  // The source that declares pat_str: the module auto_map names for
  // AutoTokenizer ("tokenization_kimi.TikTokenTokenizer"), else tokenization_kimi.py.
  std::string module = "tokenization_kimi";
  if (const Json* am = field(*cfg, "auto_map"))
    if (const Json* at = am->is_object() ? field(*am, "AutoTokenizer") : nullptr) {
      const Json* first = at->is_array() && !at->empty() ? &(*at)[0] : at;
      if (first->is_string()) {
        const std::string ref = first->get<std::string>();
        const size_t dot = ref.rfind('.');
        if (dot != std::string::npos && dot > 0 && ref.find('/') == std::string::npos) module = ref.substr(0, dot);
      }
    }
  const std::string sfile = (root / (module + ".py")).string();
  std::ifstream sin(sfile, std::ios::binary);
  if (!sin) fail("{}: cannot open file; it declares the split pattern (pat_str) of {}", sfile, rfile);
  std::stringstream ss;
  ss << sin.rdbuf();
  const std::string pattern = python_pat_str(ss.str(), "TikTokenTokenizer", sfile);
  std::string pcre;
  try {
    pcre = rust_regex_to_pcre2(pattern);
  } catch (const Error& e) {
    fail("{}: {}", sfile, e.what());
  }

  HFTokenizerFiles out;
  Vocab& v = out.vocab;
  try {
    v = tiktoken_vocab(ranks, pcre);
  } catch (const Error& e) {
    fail("{}: {}", rfile, e.what());
  }
  const size_t n = ranks.size();
  std::vector<std::string> names(kTiktokenReserved);
  for (int i = 0; i < kTiktokenReserved; ++i) names[i] = fmt::format("<|reserved_token_{}|>", n + i);
  if (const Json* added = field(*cfg, "added_tokens_decoder")) {
    if (!added->is_object()) fail("{}: 'added_tokens_decoder' must be an object of id -> token, got {}", cfile, describe(*added));
    for (const auto& [key, val] : added->items()) {
      int64_t id = key.empty() || key.size() > 9 ? -1 : 0;
      for (char c : key) id = id >= 0 && c >= '0' && c <= '9' ? id * 10 + (c - '0') : -1;
      if (id < 0) fail("{}: 'added_tokens_decoder' key \"{}\" is not a token id", cfile, printable(key, 40));
      if (id < static_cast<int64_t>(n) || id >= static_cast<int64_t>(n) + kTiktokenReserved)
        fail("{}: 'added_tokens_decoder' has id {}, outside the {} special ids {}..{} that follow the {} ranks of {}",
             cfile, id, kTiktokenReserved, n, n + kTiktokenReserved - 1, n, rfile);
      const Json* content = val.is_object() ? field(val, "content") : nullptr;
      if (!content || !content->is_string())
        fail("{}: 'added_tokens_decoder.{}.content' is missing or not a string", cfile, key);
      names[static_cast<size_t>(id) - n] = content->get<std::string>();
    }
  }
  std::unordered_map<std::string, int32_t> special_ids;
  for (int i = 0; i < kTiktokenReserved; ++i) {
    const auto id = static_cast<int32_t>(n + i);
    const auto [it, fresh] = special_ids.emplace(names[i], id);
    if (!fresh) fail("{}: special token \"{}\" is given to ids {} and {}", cfile, printable(names[i], 60), it->second, id);
    if (names[i].empty()) fail("{}: special token {} is empty", cfile, id);
    v.tokens.push_back(names[i]);
    v.types.push_back(TokenType::Control);
  }
  // BOS / EOS name special tokens; tokenization_kimi.py's defaults are [BOS] and [EOS].
  auto named_or = [&](const char* key, const char* fallback) {
    const int32_t id = token_field(*cfg, key, v, special_ids, cfile);
    if (id >= 0 || field(*cfg, key)) return id;
    const auto it = special_ids.find(fallback);
    return it == special_ids.end() ? -1 : it->second;
  };
  v.bos_id = named_or("bos_token", "[BOS]");
  v.eos_id = named_or("eos_token", "[EOS]");
  v.unk_id = token_field(*cfg, "unk_token", v, special_ids, cfile);
  v.pad_id = token_field(*cfg, "pad_token", v, special_ids, cfile);
  v.add_bos = bool_field(*cfg, "add_bos_token", false, cfile, "");
  if (v.add_bos && v.bos_id < 0) fail("{}: 'add_bos_token' is true but there is no 'bos_token'", cfile);
  read_chat_template(*cfg, cfile, out);
  finish_directory(root, out);
  return out;
}

}  // namespace

bool has_hf_tokenizer(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "tokenizer.json", ec) || fs::exists(fs::path(dir) / "tiktoken.model", ec);
}

HFTokenizerFiles load_hf_tokenizer_files(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::exists(root / "tokenizer.json", ec) && fs::exists(root / "tiktoken.model", ec))
    return load_tiktoken_files(root);
  const std::string tfile = (root / "tokenizer.json").string();
  const std::optional<Json> tj_opt = read_json(root / "tokenizer.json");
  if (!tj_opt) fail("{}: file is missing (and there is no tiktoken.model either)", tfile);
  const Json& tj = *tj_opt;
  HFTokenizerFiles out;
  Vocab& v = out.vocab;
  v.kind = TokenizerKind::ByteLevelBPE;

  if (const Json* norm = field(tj, "normalizer"))
    fail("{}: 'normalizer' is {}; a byte-level BPE tokenizer with a normalizer is not supported", tfile,
         describe(*norm));
  const Json* model = field(tj, "model");
  if (!model || !model->is_object()) fail("{}: 'model' is missing or not an object", tfile);
  const Json* mtype = field(*model, "type");
  if (!mtype || !mtype->is_string()) fail("{}: 'model.type' is missing or not a string", tfile);
  if (*mtype != "BPE") fail("{}: 'model.type' is '{}'; only BPE is supported", tfile, mtype->get<std::string>());
  if (const Json* d = field(*model, "dropout"))
    if (!d->is_number() || d->get<double>() != 0.0)
      fail("{}: 'model.dropout' is {}; BPE dropout is not supported", tfile, describe(*d));
  if (bool_field(*model, "byte_fallback", false, tfile, "model."))
    fail("{}: 'model.byte_fallback' is true; byte fallback is not supported for byte-level BPE", tfile);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* s = field(*model, key);
    if (s && (!s->is_string() || !s->get<std::string>().empty()))
      fail("{}: 'model.{}' is {}; only an empty one is supported", tfile, key, describe(*s));
  }

  // Vocabulary: piece -> id, ids dense from 0; added tokens may extend it.
  const Json* vocab = field(*model, "vocab");
  if (!vocab || !vocab->is_object() || vocab->empty())
    fail("{}: 'model.vocab' must be a non-empty object of piece -> id", tfile);
  std::unordered_map<std::string, int32_t> ids;
  std::vector<std::string> tokens;
  std::vector<bool> filled;
  auto place = [&](const std::string& piece, const Json& idj, const std::string& where) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() >= (int64_t{1} << 24))
      fail("{}: '{}' for \"{}\" must be an id in 0..16777215, got {}", tfile, where, piece, describe(idj));
    const int32_t id = static_cast<int32_t>(idj.get<int64_t>());
    if (static_cast<size_t>(id) >= tokens.size()) {
      tokens.resize(id + 1);
      filled.resize(id + 1, false);
    }
    if (filled[id] && tokens[id] != piece)
      fail("{}: id {} is given to both \"{}\" and \"{}\" ('{}')", tfile, id, tokens[id], piece, where);
    const auto [it, fresh] = ids.emplace(piece, id);
    if (!fresh && it->second != id)
      fail("{}: \"{}\" has two ids, {} and {} ('{}')", tfile, piece, it->second, id, where);
    tokens[id] = piece;
    filled[id] = true;
    return id;
  };
  for (const auto& [piece, idj] : vocab->items()) place(piece, idj, "model.vocab");

  // Added tokens: special ones are control tokens, the others user-defined.
  std::vector<std::pair<int32_t, TokenType>> added;
  if (const Json* at = field(tj, "added_tokens")) {
    if (!at->is_array()) fail("{}: 'added_tokens' must be a list, got {}", tfile, describe(*at));
    for (size_t i = 0; i < at->size(); ++i) {
      const Json& a = (*at)[i];
      const std::string where = fmt::format("added_tokens[{}]", i);
      if (!a.is_object()) fail("{}: '{}' must be an object, got {}", tfile, where, describe(a));
      const Json* content = field(a, "content");
      const Json* idj = field(a, "id");
      if (!content || !content->is_string()) fail("{}: '{}.content' is missing or not a string", tfile, where);
      if (!idj) fail("{}: '{}.id' is missing", tfile, where);
      const int32_t id = place(content->get<std::string>(), *idj, where + ".id");
      const bool special = bool_field(a, "special", false, tfile, where + ".");
      added.emplace_back(id, special ? TokenType::Control : TokenType::UserDefined);
    }
  }
  for (size_t i = 0; i < tokens.size(); ++i)
    if (!filled[i]) fail("{}: no token has id {} (ids must run from 0 to {} without gaps)", tfile, i, tokens.size() - 1);
  v.tokens = std::move(tokens);
  v.types.assign(v.tokens.size(), TokenType::Normal);
  for (const auto& [id, type] : added) v.types[id] = type;

  // Merges, best first, as "left right".
  const Json* merges = field(*model, "merges");
  if (!merges || !merges->is_array()) fail("{}: 'model.merges' is missing or not a list", tfile);
  v.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      const std::string l = m[0].get<std::string>(), r = m[1].get<std::string>();
      if (l.find(' ') != std::string::npos || r.find(' ') != std::string::npos)
        fail("{}: 'model.merges[{}]' has a piece with a space, which byte-level BPE never has", tfile, i);
      v.merges.push_back(l + " " + r);
    } else {
      fail("{}: 'model.merges[{}]' must be \"left right\" or [\"left\", \"right\"], got {}", tfile, i, describe(m));
    }
  }

  v.pre = recognise_pre_tokenizer(tj, tfile);
  const bool ignore_merges = bool_field(*model, "ignore_merges", false, tfile, "model.");
  const bool recipe_ignores = v.pre == "llama3";
  if (ignore_merges != recipe_ignores)
    fail("{}: 'model.ignore_merges' is {} but the {} pre-tokenizer it has is used with ignore_merges {}", tfile,
         ignore_merges, v.pre, recipe_ignores);

  // tokenizer_config.json: BOS / EOS, add_bos_token, the chat template.
  const fs::path cpath = root / "tokenizer_config.json";
  const std::string cfile = cpath.string();
  if (const std::optional<Json> cfg = read_json(cpath)) {
    v.bos_id = token_field(*cfg, "bos_token", v, ids, cfile);
    v.eos_id = token_field(*cfg, "eos_token", v, ids, cfile);
    v.unk_id = token_field(*cfg, "unk_token", v, ids, cfile);
    v.pad_id = token_field(*cfg, "pad_token", v, ids, cfile);
    v.add_bos = bool_field(*cfg, "add_bos_token", false, cfile, "");
    read_chat_template(*cfg, cfile, out);
  }
  if (v.add_bos && v.bos_id < 0) fail("{}: 'add_bos_token' is true but there is no 'bos_token'", cfile);
  finish_directory(root, out);
  return out;
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir, std::optional<std::string>* chat_template) {
  HFTokenizerFiles f = load_hf_tokenizer_files(dir);
  if (chat_template) *chat_template = f.chat_template;
  try {
    return std::make_unique<Tokenizer>(std::move(f.vocab));
  } catch (const Error& e) {
    std::error_code ec;
    const char* file = fs::exists(fs::path(dir) / "tokenizer.json", ec) ? "tokenizer.json" : "tiktoken.model";
    fail("{}: {}", (fs::path(dir) / file).string(), e.what());
  }
}

}  // namespace megakern
