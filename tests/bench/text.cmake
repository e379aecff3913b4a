# Tokenizer throughput (issue 50): encode of ~1 MB of English against a memcpy of the same bytes, decode and
# streaming decode per token. Run: bench/tokenizer_bench (tokenizers trained by tests/text/make_tokenizers.py
# into a temporary directory; MC_TOKENIZER=/path/to/tokenizer.json or a model directory adds a real one).
add_executable(tokenizer_bench ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bench.cpp)
target_link_libraries(tokenizer_bench PRIVATE mc_text benchmark::benchmark)
target_compile_definitions(tokenizer_bench PRIVATE MC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
set_target_properties(tokenizer_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
