// placeholder (a layer needs one source until its first real file lands)
