"""One module per figure of the chapter: each draws a tidy table into an Axes and updates the
same artists in place when the table, device or unit changes."""
