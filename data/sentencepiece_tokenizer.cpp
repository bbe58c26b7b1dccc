// SentencePiece through libsentencepiece when the build found it
// (TRAINER_HAVE_SENTENCEPIECE, CMakeLists.txt); otherwise the entry points
// say so, and tokenizers fall back to ids (data/tokenizer.h).
#include <stdexcept>

#include "data/tokenizer.h"

#ifdef TRAINER_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace trainer {

#ifdef TRAINER_HAVE_SENTENCEPIECE

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_file) {
    file = model_file;
    const auto status = sp_.Load(model_file);
    if (!status.ok()) throw std::runtime_error(model_file + ": not a SentencePiece model (" + status.ToString() + ")");
  }
  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw std::runtime_error(file + ": cannot encode the text (" + status.ToString() + ")");
    return {ids.begin(), ids.end()};
  }
  // Ids past the model's pieces (a model.vocab_size larger than the
  // tokenizer's) have no text: shown as <id>.
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      std::string s;
      if (!run.empty() && sp_.Decode(run, &s).ok()) out += s;
      run.clear();
    };
    for (int32_t t : ids) {
      if (t >= 0 && t < sp_.GetPieceSize()) {
        run.push_back(t);
      } else {
        flush();
        out.append(1, '<').append(std::to_string(t)).append(1, '>');
      }
    }
    flush();
    return out;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

bool have_sentencepiece() { return true; }

std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& model_file) {
  return std::make_unique<SentencePieceTokenizer>(model_file);
}

#else

bool have_sentencepiece() { return false; }

std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& model_file) {
  throw std::runtime_error(model_file + ": this trainer was built without libsentencepiece (apt-get install "
                           "libsentencepiece-dev, scripts/setup.sh, and rebuild)");
}

#endif

}  // namespace trainer
