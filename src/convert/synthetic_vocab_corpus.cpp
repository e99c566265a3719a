// The text synthetic vocabularies learn their merges from: plain English
// prose, a chat exchange and a little C++ and Python, written for this project.
// Only its statistics matter (which byte pairs are common), so it is short.
#include "convert/synthetic_vocab.h"

namespace moeserve::convert {

std::string_view synthetic_vocab_corpus() {
  return R"corpus(The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away into the forest.
Once upon a time there was a small village at the edge of a large forest. The people of the village worked in the fields
during the day and told stories by the fire at night. Every story started the same way, and every story ended with a
lesson that the children were supposed to remember. Most of them did not, of course, but they liked the stories anyway.

A mixture of experts model routes each token to a few of its experts. The router computes a score for every expert,
keeps the best ones, and the layer output is the weighted sum of the selected experts' outputs. Because only a small
part of the parameters is used for each token, the model can be large while the cost per token stays small. The
experts that are chosen most often are called popular experts, and placing them well across devices matters for speed.

Language models read text as tokens. A tokenizer splits the text into pieces, and each piece is mapped to a number.
Byte pair encoding starts from single bytes and repeatedly merges the most frequent pair of neighbouring symbols into a
new symbol. After enough merges, common words such as "the", "and", "model" and "token" become single tokens, while
rare words are still spelled out from smaller pieces. This makes every possible input representable.

What is the weather like today? It is sunny in the morning, with a chance of rain in the afternoon. Temperatures will
reach twenty degrees in the city and a little less near the coast. Tomorrow will be cloudy and cooler.

User: Can you explain how attention works?
Assistant: Sure. For each position, the model computes a query, a key and a value. The query is compared with the keys
of all earlier positions, the scores are turned into weights with a softmax, and the output is the weighted sum of the
values. Several heads do this in parallel, each looking at a different part of the representation.
User: And what does the key value cache store?
Assistant: It stores the keys and values of the tokens that were already processed, so that generating the next token
only needs to compute the new position instead of the whole sequence again.

Numbers appear in text all the time: 1, 2, 3, 10, 42, 100, 2024, 3.14159, 0.5, 1e-6, 151936, 4096, 2048, 128.

#include <cstdio>
#include <string>
#include <vector>

// Returns the sum of the values in the vector.
int sum_values(const std::vector<int>& values) {
  int total = 0;
  for (int value : values) {
    total += value;
  }
  return total;
}

int main(int argc, char** argv) {
  std::vector<int> values = {1, 2, 3, 4, 5};
  if (argc > 1) {
    std::printf("usage: %s\n", argv[0]);
    return 1;
  }
  std::printf("sum = %d\n", sum_values(values));
  return 0;
}

def tokenize(text, vocab):
    """Split the text into tokens and return their ids."""
    tokens = []
    for word in text.split():
        if word in vocab:
            tokens.append(vocab[word])
        else:
            tokens.extend(vocab[ch] for ch in word if ch in vocab)
    return tokens


class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, value=1):
        self.counts[key] = self.counts.get(key, 0) + value

    def most_common(self, n=10):
        return sorted(self.counts.items(), key=lambda item: -item[1])[:n]


if __name__ == "__main__":
    counter = Counter()
    for line in open("input.txt"):
        for word in line.split():
            counter.add(word.lower())
    print(counter.most_common())

The function returns the number of elements in the list. If the list is empty, it returns zero. The caller should check
the return value before using the result, because an error is reported as a negative number. When the input is not
valid, the function does not crash: it reports the problem and leaves everything as it was.
In the beginning the project was small, with only a few files and a single test. Over time it grew into a server that
loads models, tokenizes requests, runs the layers on the processor or the graphics card and streams the answer back.
Each part has its own folder, its own tests and a short document that explains why it is built the way it is.
)corpus";
}

}  // namespace moeserve::convert
