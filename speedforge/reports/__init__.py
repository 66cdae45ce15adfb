"""Reports for people: plain-text tables on the terminal now (`text`); the portability reports
(HTML, Markdown, JSON) belong here beside them."""
