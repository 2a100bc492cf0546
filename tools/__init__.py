"""The book's build tools, run from the checkout (make publish, make assignments); not part of the
installed package."""
