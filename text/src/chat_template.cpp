// placeholder: filled by the chat_template work (issue 50)
