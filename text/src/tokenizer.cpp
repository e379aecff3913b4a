// placeholder: filled by the tokenizer work (issue 50)
