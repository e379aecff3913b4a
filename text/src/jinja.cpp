// placeholder: filled by the jinja work (issue 50)
