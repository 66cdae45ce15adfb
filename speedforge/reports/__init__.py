"""Reports for people: plain-text tables on the terminal (`text`); the portability table
(`portability`), its figures (`plots`) and its HTML, Markdown and JSON documents
(`portability_report`, with the JSON's schema and the HTML template as package data)."""
