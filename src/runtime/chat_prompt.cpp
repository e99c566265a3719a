#include "runtime/chat_prompt.h"

#include "chat/chat_template.h"

namespace moeserve::runtime {

Result<std::string> render_chat_prompt(const Model& model, const nlohmann::ordered_json& messages) {
  const std::string& source = model.tokenizer().chat_template();
  if (source.empty()) {
    return make_error(
        StatusCode::kNotFound,
        "{}: the file has no chat template (tokenizer.chat_template); give plain-text prompts and "
        "write them in the model's format yourself",
        model.file().name());
  }
  MOESERVE_ASSIGN_OR_RETURN(chat::ChatTemplate tmpl, chat::ChatTemplate::parse(source));
  chat::ChatRenderInput in;
  in.messages = messages;
  in.add_generation_prompt = true;
  const tok::Tokenizer& t = model.tokenizer();
  if (t.bos_id()) in.bos_token = t.token_text(*t.bos_id());
  if (t.eos_id()) in.eos_token = t.token_text(*t.eos_id());
  return tmpl.render(in);
}

}  // namespace moeserve::runtime
